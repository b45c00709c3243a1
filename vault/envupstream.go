package vault

// EnvUpstreamAction says what SyncEnvUpstream did.
type EnvUpstreamAction string

// SyncEnvUpstream actions.
const (
	// EnvUpstreamRegistered: there was no upstream of that name; it was registered.
	EnvUpstreamRegistered EnvUpstreamAction = "registered"
	// EnvUpstreamReplaced: the value changed since the last start and differed
	// from the registered secret, which it replaced.
	EnvUpstreamReplaced EnvUpstreamAction = "replaced"
	// EnvUpstreamUnchanged: the value changed since the last start (or was never
	// seen) but is the registered secret already; only its fingerprint was stored.
	EnvUpstreamUnchanged EnvUpstreamAction = "unchanged"
	// EnvUpstreamKept: the value is the one of the last start, so the upstream is
	// left as it is — also when an admin changed it through the API since.
	EnvUpstreamKept EnvUpstreamAction = "kept"
)
