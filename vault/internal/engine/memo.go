package engine

import "sync"

// memo keeps, on a store no other process writes (Config.SoleWriter), what the
// proxy reads on every request and only an admin's change alters: the key each
// authenticated token belongs to, and the upstreams' unsealed secrets. So the
// hot path authenticates and finds its secret without a read transaction.
//
// Every write transaction that could change them (Engine.update: every key and
// upstream change, and the admin's other writes) empties the memo once it has
// committed, so a revoked, rotated or changed key and a replaced secret take
// effect from the next request on. A read that began before such a write must
// not put back what it read: the generation, taken before the read and bumped
// by each emptying, tells. A nil *memo keeps nothing, nor does a closed one:
// once its store is closed, a request must meet the closed store, not what
// the memo kept of it.
//
// A store other processes write keeps only keys in one (Engine.remembered,
// Config.RememberKeys): its own writes empty it the same way, another
// process's do not, and whoever uses what it answers checks it
// (vault.KeyRememberer).
type memo struct {
	mu      sync.Mutex
	gen     uint64
	closed  bool
	keys    map[string]authRec // token hash → key
	secrets map[string]string  // upstream name → secret
}

// memoMax bounds each map; a full one starts over.
const memoMax = 10000

func (m *memo) generation() uint64 {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gen
}

func (m *memo) forget() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gen++
	m.keys, m.secrets = nil, nil
}

// close empties the memo for good.
func (m *memo) close() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gen++
	m.keys, m.secrets, m.closed = nil, nil, true
}

// key returns the key of the token hash, if kept. It shares maps and slices
// with the memo: read it, or take public().
func (m *memo) key(hash string) (authRec, bool) {
	if m == nil {
		return authRec{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.keys[hash]
	return rec, ok
}

// keepKey keeps rec as the key of the token hash, read under generation gen.
func (m *memo) keepKey(gen uint64, hash string, rec authRec) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gen != gen || m.closed {
		return
	}
	if m.keys == nil || len(m.keys) >= memoMax {
		m.keys = map[string]authRec{}
	}
	m.keys[hash] = rec
}

// dropKey forgets the key of the token hash.
func (m *memo) dropKey(hash string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.keys, hash)
}

func (m *memo) secret(name string) (string, bool) {
	if m == nil {
		return "", false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.secrets[name]
	return s, ok
}

// keepSecret keeps the secret of upstream name, read under generation gen.
func (m *memo) keepSecret(gen uint64, name, secret string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gen != gen || m.closed {
		return
	}
	if m.secrets == nil || len(m.secrets) >= memoMax {
		m.secrets = map[string]string{}
	}
	m.secrets[name] = secret
}
