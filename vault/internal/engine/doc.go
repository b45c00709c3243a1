// Package engine is every rule of keybrake's vault — keys and upstreams, the
// metering of holds and money objects against caps and windows, idempotency
// records, the claims API, the ledger and the audit, the reaper and the
// invariant check, tokens and sealing — written once, over Tx: a small
// ordered key-value transaction that each store implements on its own engine
// (vault/bolt on bbolt, vault/postgres on PostgreSQL). A store runs the
// transactions (Backend) and keeps the bytes; it holds no rule of its own, so
// the two cannot drift. Engine implements vault.Store but for what only a
// store can do (Size, Backup, Close).
//
// Write transaction bodies may run more than once (bbolt's group committer
// re-runs a failed batch's operations alone; PostgreSQL re-runs a transaction
// after a serialization failure, a deadlock or a unique violation), so each
// starts over on every run. An operation keeps its business outcome and the
// domain error that turned it down before any write (txResult) apart from the
// failures that roll its transaction back.
//
// In a write transaction the engine locks a vault key (Tx.LockKey, or a Get of
// the key's own entry) before it reads anything of the key's: on a store with
// concurrent writers that orders every write under one key, as bbolt's single
// writer does.
//
// testhooks.go is for tests only.
package engine
