package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"

	"github.com/keybrake/keybrake/proxy/fakestripe"
)

// serve --demo: keybrake in front of the fake Stripe the tests use, so that it
// can be tried without a Stripe account. Nothing reaches Stripe and no money
// moves, and every surface says so: the banner, the dashboard (a notice on
// every page) and a header on every answer of both listeners.

const (
	// demoSecret is the secret the demo's fake Stripe accepts and the upstream
	// "default" is registered with.
	demoSecret = "sk_test_keybrake_demo_not_stripe"
	// demoDataDir is the demo's data directory unless --data-dir names one:
	// a demo never shares a real vault's.
	demoDataDir = "./keybrake-demo"
	// headerDemo marks every answer of a demo.
	headerDemo = "Keybrake-Demo"
	// demoHeaderValue is what it says.
	demoHeaderValue = "not Stripe: keybrake serve --demo answers with its built-in fake Stripe; no money moves"
)

// applyDemo fixes the demo's configuration after the flags and the
// environment are read: its own data directory unless one is named, and no
// --stripe-url, since the upstream is the built-in fake.
func (c *Config) applyDemo(fs *flag.FlagSet) error {
	if !c.Demo {
		return nil
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if given["stripe-url"] {
		return fmt.Errorf("--demo and --stripe-url: the demo's upstream is keybrake's built-in fake Stripe; drop one of them")
	}
	if !given["data-dir"] {
		c.DataDir = demoDataDir
	}
	return nil
}

// startDemo starts the fake Stripe and makes it the upstream "default". It
// refuses a Stripe key in STRIPE_SECRET_KEY (a live one above all) and a
// store whose upstreams hold any other secret than the demo's: a demo never
// runs on a vault that spends real money.
func (m *Main) startDemo(ctx context.Context, log *slog.Logger) (*url.URL, error) {
	if secret := m.Getenv(envStripeKey); secret != "" {
		if strings.HasPrefix(secret, "sk_live_") || strings.HasPrefix(secret, "rk_live_") {
			return nil, fmt.Errorf("--demo refuses to start with a live Stripe key in %s: a demo answers with a fake Stripe and must never hold a key that moves real money; unset it", envStripeKey)
		}
		return nil, fmt.Errorf("--demo does not use %s (its upstream is the built-in fake Stripe): unset it, or run serve without --demo to use that key", envStripeKey)
	}
	ups, err := m.store.ListUpstreams(ctx)
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	for _, u := range ups {
		secret, err := m.store.UpstreamSecret(ctx, u.Name)
		if err != nil {
			return nil, fmt.Errorf("demo: upstream %s: %w", u.Name, err)
		}
		if secret != demoSecret {
			return nil, fmt.Errorf("--demo refuses this store: its upstream %q holds a real Stripe key (…%s); run the demo on a data directory of its own (the default, %s)", u.Name, u.SecretLast4, demoDataDir)
		}
	}
	fake, err := fakestripe.Start(demoSecret)
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	m.demoStripe = fake
	if err := m.registerDefaultUpstream(ctx, log, demoSecret); err != nil {
		return nil, err
	}
	u, err := url.Parse(fake.URL)
	if err != nil {
		return nil, fmt.Errorf("demo: fake stripe url: %w", err)
	}
	log.Warn("demo: the upstream is keybrake's built-in fake Stripe, not Stripe; no money moves", "stripe_url", fake.URL)
	return u, nil
}

// demoHeaders marks every answer of h as the demo's.
func demoHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(headerDemo, demoHeaderValue)
		h.ServeHTTP(w, r)
	})
}

// demoBanner is the banner's notice in a demo.
func (m *Main) demoBanner() string {
	if !m.Config.Demo {
		return ""
	}
	return `
  ***  DEMO: the upstream is keybrake's built-in fake Stripe at ` + m.demoStripe.URL + `,
  ***  NOT Stripe. Nothing reaches Stripe and no money moves; its objects live
  ***  in memory until keybrake stops. Data directory: ` + m.Config.DataDir + `
`
}
