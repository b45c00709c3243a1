// Package stripeapi is keybrake's knowledge of Stripe's API as pure data and
// parsing, with no HTTP server and no store:
//
//   - the strict reader of request bodies (ParseForm for v1's Rack-style forms,
//     ParseJSON for v2), which refuses anything Stripe and keybrake could read
//     two ways (ErrMalformed);
//   - the operation catalogue and Classify: method + path + parameters → the
//     operation ("charges.create"), whether and which way it moves money, its
//     amount or where to look it up, the money object it is counted on
//     (Classification); Routes, Operations and CheckOperation for the names a
//     policy may use;
//   - Accounts: every place a request can name a connected account;
//     RevealedSecret: an expand that would reveal a spendable secret;
//   - reading Stripe's answers: money objects (ReadMoneyObject), amount lookups
//     (ReadLookup), stored prices (ReadPrice), error bodies.
//
// The proxy package runs requests through this knowledge; contributors add an
// operation here (CONTRIBUTING.md says how). The decisions behind every entry of
// the catalogue are at the top of catalogue.go.
package stripeapi
