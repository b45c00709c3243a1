package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keybrake/keybrake/vault"
	"github.com/keybrake/keybrake/vault/internal/engine"
)

const (
	// maxAttempts bounds how often a transaction runs again after a
	// serialization failure, a deadlock or a unique violation.
	maxAttempts = 10
	// submitTimeout bounds a hot-path write once it has begun: it goes on if
	// the caller gives up (its result must not be lost), but not for ever.
	submitTimeout = 30 * time.Second
	// cursorChunk is how many entries one query of a cursor reads.
	cursorChunk = 256
)

// table is the table of a bucket.
func table(b engine.Bucket) string { return "keybrake_" + b.Name() }

// tableNames lists every bucket's table.
func tableNames() []string {
	var out []string
	for _, b := range engine.Buckets() {
		out = append(out, table(b))
	}
	return out
}

// SQL of each bucket, built once.
var queries = func() (q [engine.NumBuckets]struct {
	get, getForUpdate, getMany, nextval, first, last, from, after, before string
}) {
	for _, b := range engine.Buckets() {
		t := table(b)
		q[b].get = "SELECT v FROM " + t + " WHERE k = $1"
		q[b].getForUpdate = q[b].get + " FOR UPDATE"
		q[b].getMany = "SELECT k, v FROM " + t + " WHERE k = ANY($1::bytea[])"
		q[b].nextval = "SELECT nextval('" + t + "_seq')"
		q[b].first = "SELECT k, v FROM " + t + " ORDER BY k LIMIT $1"
		q[b].last = "SELECT k, v FROM " + t + " ORDER BY k DESC LIMIT $1"
		q[b].from = "SELECT k, v FROM " + t + " WHERE k >= $1 ORDER BY k LIMIT $2"
		q[b].after = "SELECT k, v FROM " + t + " WHERE k > $1 ORDER BY k LIMIT $2"
		q[b].before = "SELECT k, v FROM " + t + " WHERE k < $1 ORDER BY k DESC LIMIT $2"
	}
	return q
}()

// throughSQL[b][via] reads an entry of b and the entry of via its value
// names, in one statement (tx.GetThrough).
var throughSQL = func() (q [engine.NumBuckets][engine.NumBuckets]string) {
	for _, b := range engine.Buckets() {
		for _, via := range engine.Buckets() {
			q[b][via] = "SELECT a.v, b.v FROM " + table(b) + " a LEFT JOIN " + table(via) + " b ON b.k = a.v WHERE a.k = $1"
		}
	}
	return q
}()

// statements keeps the text of statements built from their parts, by a key
// that names the parts: each is built once, then read on every use. A few
// combinations recur.
type statements[K comparable] struct {
	built engine.Bounded[K, string]
}

func (c *statements[K]) of(k K, build func() string) string {
	if q, ok := c.built.Get(k); ok {
		return q
	}
	q := build()
	c.built.Put(k, q)
	return q
}

const lockKeySQL = "SELECT 1 FROM keybrake_keys WHERE k = $1 FOR UPDATE"

// backend is the Store as the engine's Backend: its transactions.
type backend Store

// View runs fn in a REPEATABLE READ, READ ONLY transaction: one snapshot.
func (s *backend) View(ctx context.Context, fn engine.TxFunc) error {
	return s.run(ctx, false, fn)
}

// Update runs fn in a READ COMMITTED write transaction, again from the start
// after a serialization failure, a deadlock or a unique violation.
func (s *backend) Update(ctx context.Context, fn engine.TxFunc) error {
	return s.run(ctx, true, fn)
}

// Submit is Update for the hot path: once begun, it goes on if ctx ends, for
// at most submitTimeout, so that a durable write is never reported lost. A
// write that says nothing of what it locks (the claims API, Ping, an
// observation) runs in a transaction of its own; Reserve and Settle say it
// and are group committed (SubmitPrefetch).
func (s *backend) Submit(ctx context.Context, fn engine.TxFunc) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), submitTimeout)
	defer cancel()
	start := time.Now()
	err := s.run(ctx, true, fn)
	if s.observe != nil && err == nil {
		s.observe(1, time.Since(start))
	}
	return err
}

// Queue runs fn as Submit does, and done learns its outcome before Queue
// returns.
func (s *backend) Queue(ctx context.Context, fn engine.TxFunc, done func(error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	done(s.Submit(ctx, fn))
	return nil
}

// Read runs fn outside a transaction (engine.Reader): each of its reads is a
// statement of its own, which sees what is committed as it runs; now is the
// database's clock as last measured. Nothing fn writes is kept.
func (s *backend) Read(ctx context.Context, fn engine.TxFunc) error {
	return translate(s.retry(ctx, func() error {
		t := &tx{ctx: ctx, s: s, outside: true}
		defer t.release()
		return fn(t, (*Store)(s).Now().UTC())
	}))
}

func (s *backend) run(ctx context.Context, write bool, fn engine.TxFunc) error {
	return translate(s.retry(ctx, func() error {
		return s.once(ctx, write, nil, func(t *tx, now time.Time) error { return fn(t, now) })
	}))
}

// retry runs attempt, again after a serialization failure, a deadlock or a
// unique violation, and returns its last error untranslated.
func (s *backend) retry(ctx context.Context, attempt func() error) error {
	if s.closed.Load() {
		return vault.ErrClosed
	}
	for n := 1; ; n++ {
		err := attempt()
		if err != nil && s.closed.Load() && !engine.IsVaultError(err) {
			return vault.ErrClosed // the pool closed under the transaction
		}
		if err == nil || !retryable(err) || n == maxAttempts {
			return err
		}
		if isDeadlock(err) {
			s.deadlocks.Add(1)
		}
		// Back off a little, at random, so that the transactions that collided
		// do not collide again.
		wait := time.Duration(rand.Int64N(int64(time.Millisecond) << min(n, 6)))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// once runs body in one transaction on one connection; pl, when set, is what
// the transaction locks and reads as it begins.
func (s *backend) once(ctx context.Context, write bool, pl *plan, body func(t *tx, now time.Time) error) (err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	t := &tx{ctx: ctx, s: s, conn: conn.Conn(), write: write}
	defer func() {
		if status := conn.Conn().PgConn().TxStatus(); status != 'I' {
			// Failed or abandoned: roll back; a connection that cannot is
			// closed, which rolls back too (Release drops it).
			if _, rerr := conn.Conn().Exec(context.WithoutCancel(ctx), "ROLLBACK"); rerr != nil {
				_ = conn.Conn().Close(context.WithoutCancel(ctx))
			}
		}
		conn.Release()
	}()
	now, err := t.begin(pl)
	if err != nil {
		return err
	}
	if s.now != nil {
		now = s.now()
	}
	if err := body(t, now); err != nil {
		return err
	}
	if t.err != nil {
		return t.err // a cursor failed: what fn saw may be short
	}
	return t.commit()
}

// retryable reports whether err rolled its transaction back for a reason that
// running it again can cure.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "40001", "40P01", "23505": // serialization_failure, deadlock_detected, unique_violation
		return true
	}
	return false
}

// isDeadlock reports whether err is the server breaking a deadlock.
func isDeadlock(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "40P01"
}

// translate maps PostgreSQL's and pgx's errors to the vault's vocabulary so
// that nothing above this package sees them. The vault's own pass through,
// but for a deadline: a database that did not answer in time (a lock held by
// a frozen replica, a server that hangs) is a store that is unavailable
// (ErrStorage, which the surfaces answer 503, retryable), still matching
// context.DeadlineExceeded.
func translate(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, vault.ErrStorage):
		return fmt.Errorf("%w: PostgreSQL did not answer in time: %w", vault.ErrStorage, err)
	case engine.IsVaultError(err):
		return err
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		var timedOut *lockTimedOut
		switch {
		case pgErr.Code == "55P03", errors.As(err, &timedOut): // lock_not_available: lock_timeout
			return fmt.Errorf("%w: PostgreSQL: a lock stayed held for longer than lock_timeout (another replica holds the key) (SQLSTATE %s)",
				vault.ErrStorage, pgErr.Code)
		}
		return fmt.Errorf("%w: PostgreSQL: %s (SQLSTATE %s)", vault.ErrStorage, pgErr.Message, pgErr.Code)
	}
	return fmt.Errorf("%w: PostgreSQL: %s", vault.ErrStorage, err.Error())
}

// parseURL parses a database URL into a pool's configuration.
func parseURL(raw string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(raw)
	if err != nil {
		// The parser's message may quote the URL: say only what is wrong.
		return nil, fmt.Errorf("the database URL does not parse as postgres://user:password@host:port/database?…: %w", vault.ErrInvalid)
	}
	return cfg, nil
}

// hasParam reports whether the connection URL sets the query parameter name.
func hasParam(raw, name string) bool {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return strings.Contains(raw, name+"=")
	}
	return u.Query().Has(name)
}

// op is a write buffered in a transaction until its commit.
type op struct {
	kind int // opPut, opInsert, opDelete
	v    []byte
}

const (
	opPut = iota
	opInsert
	opDelete
)

// appended is an entry of Append, buffered.
type appended struct {
	b         engine.Bucket
	prefix, v []byte
}

type opKey struct {
	b engine.Bucket
	k string
}

// known is an entry as the transaction last read or wrote it: found false
// when there is none.
type known struct {
	v     []byte
	found bool
}

// tx is one PostgreSQL transaction as the engine sees it. Reads go to the
// database at once (after the key's lock, they see the newest committed
// data), unless the transaction read the entry as it began (a plan) or wrote
// it since; writes wait in ops, which later reads of the same keys see, and
// go with the COMMIT in one round trip — or before a cursor's query, which
// must see them.
type tx struct {
	ctx  context.Context
	s    *backend
	conn *pgx.Conn
	// outside says that the tx runs no transaction (Read): its reads take
	// a connection of the pool when they first need one (connect), and
	// GetThroughWith shares a statement with the replica's other requests
	// (lookup.go).
	outside bool
	pooled  *pgxpool.Conn
	write   bool
	ops     map[opKey]*op
	order   []opKey
	// appends are the entries of Append, whose keys the database completes.
	appends []appended
	locked  map[string]bool
	// seen holds the entries the plan read under its locks, and every entry
	// written since (nil without a plan): no other transaction can change
	// them before this one ends.
	seen map[opKey]known
	// held names the rows the plan found and locked, "k" or "b" and the
	// key's or budget's id (as locksOf does): what an operation taken into
	// the transaction may lock.
	held map[string]bool
	err  error // the first failure of a cursor
	// dbErr is the first failure of a statement: the transaction is lost,
	// whatever the engine's bodies made of it.
	dbErr error
}

// connect takes a connection of the pool for a tx outside a transaction,
// once, before its first statement; release gives it back.
func (t *tx) connect() error {
	if t.conn != nil {
		return nil
	}
	c, err := t.s.pool.Acquire(t.ctx)
	if err != nil {
		return t.failed(err)
	}
	t.pooled, t.conn = c, c.Conn()
	return nil
}

func (t *tx) release() {
	if t.pooled != nil {
		t.pooled.Release()
		t.pooled, t.conn = nil, nil
	}
}

// failed records err, a statement's failure, and returns it.
func (t *tx) failed(err error) error {
	if err != nil && t.dbErr == nil {
		t.dbErr = err
	}
	return err
}

// begin starts the transaction, takes the plan's locks, reads its entries
// and the database's clock, in one round trip.
func (t *tx) begin(pl *plan) (time.Time, error) {
	mode := "BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE"
	if !t.write {
		mode = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
	}
	b := &pgx.Batch{}
	b.Queue(mode)
	if pl != nil {
		pl.queue(b)
	}
	// The clock last: after the locks, which may have been waited for.
	before := t.s.processNow()
	now, err := t.sendWithClock(b, func(br pgx.BatchResults) error {
		_, err := br.Exec()
		if err == nil && pl != nil {
			err = pl.read(br, t)
		}
		return err
	})
	if err != nil {
		return time.Time{}, err
	}
	after := t.s.processNow()
	if pl != nil && pl.locks() {
		// The clock was read just before the answer came back, after a lock
		// wait of unknown length.
		before = after
	}
	(*Store)(t.s).measure(before, now, after)
	return now.UTC(), nil
}

// sendWithClock sends b with the server's clock read last, in one round
// trip: read reads the answers to b's own statements, then the clock is
// scanned. A failure is the transaction's (failed).
func (t *tx) sendWithClock(b *pgx.Batch, read func(pgx.BatchResults) error) (time.Time, error) {
	b.Queue("SELECT clock_timestamp()")
	br := t.conn.SendBatch(t.ctx, b)
	t.s.roundTrips.Add(1)
	var now time.Time
	err := read(br)
	if err == nil {
		err = br.QueryRow().Scan(&now)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return time.Time{}, t.failed(err)
	}
	return now, nil
}

// commit sends the buffered writes and COMMIT in one round trip.
func (t *tx) commit() error {
	if !t.write {
		_, err := t.conn.Exec(t.ctx, "COMMIT")
		t.s.roundTrips.Add(1)
		return t.failed(err)
	}
	b := t.batch()
	b.Queue("COMMIT")
	if err := t.send(b); err != nil {
		return err
	}
	if t.conn.PgConn().TxStatus() != 'I' {
		return fmt.Errorf("%w: PostgreSQL did not commit", vault.ErrStorage)
	}
	return nil
}

// flush sends the buffered writes, so that a query sees them.
func (t *tx) flush() error {
	if len(t.order) == 0 && len(t.appends) == 0 {
		return nil
	}
	return t.send(t.batch())
}

// batch queues the buffered writes and forgets them: one statement for all
// of them, a part of it (a data-modifying WITH) per bucket and kind of write,
// whatever the number of entries. The parts' arrays share two slices, laid
// out by kind and bucket, and their keys are the bytes of the ops' map keys.
func (t *tx) batch() *pgx.Batch {
	var count, next [3][engine.NumBuckets]int
	for _, k := range t.order {
		count[t.ops[k].kind][k.b]++
	}
	n := 0
	for kind := range count {
		for bucket := range count[kind] {
			next[kind][bucket] = n
			n += count[kind][bucket]
		}
	}
	first := next
	keys, values := make(byteaArray, n), make(byteaArray, n)
	for _, k := range t.order {
		o := t.ops[k]
		i := next[o.kind][k.b]
		next[o.kind][k.b]++
		keys[i], values[i] = stringBytes(k.k), o.v
	}
	var w writes
	for bucket := range engine.NumBuckets {
		if i, j := first[opDelete][bucket], next[opDelete][bucket]; j > i {
			w.add(opDelete, bucket, keys[i:j], nil)
		}
		if i, j := first[opInsert][bucket], next[opInsert][bucket]; j > i {
			w.add(opInsert, bucket, keys[i:j], values[i:j])
		}
		if i, j := first[opPut][bucket], next[opPut][bucket]; j > i {
			w.add(opPut, bucket, keys[i:j], values[i:j])
		}
	}
	if len(t.appends) > 0 {
		// Each bucket's in the order appended: they take their sequence
		// numbers in that order.
		slices.SortStableFunc(t.appends, func(x, y appended) int { return int(x.b) - int(y.b) })
		prefixes, values := make(byteaArray, len(t.appends)), make(byteaArray, len(t.appends))
		for i, a := range t.appends {
			prefixes[i], values[i] = a.prefix, a.v
		}
		for i := 0; i < len(t.appends); {
			j := i + 1
			for j < len(t.appends) && t.appends[j].b == t.appends[i].b {
				j++
			}
			w.add(opAppend, t.appends[i].b, prefixes[i:j], values[i:j])
			i = j
		}
	}
	b := &pgx.Batch{}
	if len(w.parts) > 0 {
		b.Queue(writeSQL(w.parts), w.args...)
	}
	t.ops, t.order, t.appends = nil, nil, nil
	return b
}

// opAppend is the kind of write of Append's entries, in a statement's parts.
const opAppend = opDelete + 1

// writes are the parts of a transaction's write statement and their
// arguments.
type writes struct {
	parts []writePart
	args  []any
}

// writePart is one part of a write statement: one kind of write to one
// bucket.
type writePart struct {
	kind int // opPut, opInsert, opDelete, opAppend
	b    engine.Bucket
}

func (w *writes) add(kind int, b engine.Bucket, keys, values byteaArray) {
	w.parts = append(w.parts, writePart{kind, b})
	w.args = append(w.args, keys)
	if kind != opDelete {
		w.args = append(w.args, values)
	}
}

// writeStatements are the write statements built so far, by their parts
// (writeSQL).
var writeStatements statements[string]

// writeSQL is the statement that makes the writes of parts, in that order of
// its arguments: a data-modifying WITH per part but the last. Every part
// sees the snapshot the statement began with; none reads what another
// writes, and no two write one row (a transaction buffers one write per
// entry, and an appended entry's key is new).
func writeSQL(parts []writePart) string {
	sig := make([]byte, 0, 16)
	for _, p := range parts {
		sig = append(sig, byte(p.kind), byte(p.b))
	}
	return writeStatements.of(string(sig), func() string { return buildWriteSQL(parts) })
}

func buildWriteSQL(parts []writePart) string {
	var sb strings.Builder
	arg := 1
	for i, p := range parts {
		switch {
		case len(parts) == 1:
		case i == 0:
			sb.WriteString("WITH w0 AS (")
		case i < len(parts)-1:
			fmt.Fprintf(&sb, "), w%d AS (", i)
		default:
			sb.WriteString(") ")
		}
		t := table(p.b)
		rows := fmt.Sprintf("unnest($%d::bytea[], $%d::bytea[])", arg, arg+1)
		switch p.kind {
		case opDelete:
			fmt.Fprintf(&sb, "DELETE FROM %s WHERE k = ANY($%d::bytea[])", t, arg)
			arg++
			continue
		case opInsert:
			fmt.Fprintf(&sb, "INSERT INTO %s (k, v) SELECT k, v FROM %s AS u(k, v)", t, rows)
		case opPut:
			fmt.Fprintf(&sb, "INSERT INTO %s (k, v) SELECT k, v FROM %s AS u(k, v) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v", t, rows)
		case opAppend:
			// Appends take their sequence numbers in the order they were
			// made.
			fmt.Fprintf(&sb, "INSERT INTO %s (k, v) SELECT p || int8send(nextval('%s_seq')), v FROM "+
				"(SELECT p, v FROM %s WITH ORDINALITY AS u(p, v, n) ORDER BY n) AS o", t, t, rows)
		}
		arg += 2
	}
	return sb.String()
}

// readStatements are the statements of a plan's reads (readSQL), by the
// set of buckets they read.
var readStatements statements[uint64]

// readSQL is the statement that reads the entries of the buckets of set (a
// bit per bucket) named by its arguments, one array of keys per bucket in
// bucket order: rows of (bucket, k, v).
func readSQL(set uint64) string {
	return readStatements.of(set, func() string {
		var parts []string
		for b := range engine.NumBuckets {
			if set&(1<<b) != 0 {
				parts = append(parts, fmt.Sprintf("SELECT %d::int2, k, v FROM %s WHERE k = ANY($%d::bytea[])", b, table(b), len(parts)+1))
			}
		}
		return strings.Join(parts, " UNION ALL ")
	})
}

// stringBytes is s's bytes, without a copy: for a statement's argument,
// which pgx only reads.
func stringBytes(s string) []byte {
	if s == "" {
		return []byte{} // an empty bytea, not NULL
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// send sends b and reads every result: the first error is the batch's.
func (t *tx) send(b *pgx.Batch) error {
	br := t.conn.SendBatch(t.ctx, b)
	t.s.roundTrips.Add(1)
	var err error
	for range b.Len() {
		if _, e := br.Exec(); e != nil && err == nil {
			err = e
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return t.failed(err)
}

// cached returns what the transaction knows of k in b without asking the
// database: its buffered write, or the entry as the plan read it or as the
// transaction last wrote it.
func (t *tx) cached(b engine.Bucket, k []byte) (known, bool) {
	if o, ok := t.ops[opKey{b, string(k)}]; ok {
		return known{v: o.v, found: o.kind != opDelete}, true
	}
	e, ok := t.seen[opKey{b, string(k)}]
	return e, ok
}

func (t *tx) buffer(b engine.Bucket, k []byte, kind int, v []byte) {
	key := opKey{b, string(k)}
	v = bytes.Clone(v)
	if t.seen != nil {
		// Written here, the entry is this transaction's until it ends: a
		// read after a flush need not ask the database.
		t.seen[key] = known{v: v, found: kind != opDelete}
	}
	if t.ops == nil {
		t.ops = map[opKey]*op{}
	}
	if o, ok := t.ops[key]; ok {
		// An insert written again is still an insert: the key was free when
		// this transaction took it.
		if !(o.kind == opInsert && kind == opPut) {
			o.kind = kind
		}
		o.v = v
		return
	}
	t.ops[key] = &op{kind: kind, v: v}
	t.order = append(t.order, key)
}

func (t *tx) Get(b engine.Bucket, k []byte) ([]byte, error) {
	if e, ok := t.cached(b, k); ok {
		return e.v, nil
	}
	sql := queries[b].get
	forUpdate := t.write && engine.LocksOnRead(b)
	if forUpdate {
		sql = queries[b].getForUpdate
	}
	var v []byte
	var err error
	if forUpdate {
		err = t.lockingRead(sql, k, &v)
	} else {
		if err := t.connect(); err != nil {
			return nil, err
		}
		err = t.conn.QueryRow(t.ctx, sql, k).Scan(&v)
		t.s.roundTrips.Add(1)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, t.failed(err)
	}
	if forUpdate && b == engine.BucketKeys {
		t.markLocked(string(k))
	}
	return v, nil
}

// GetThrough reads k in b and the entry of via its value names in one
// statement (engine.ThroughGetter). A write transaction reads them as Get
// does, each with its lock and what the transaction wrote or planned.
func (t *tx) GetThrough(b engine.Bucket, k []byte, via engine.Bucket) (ref, v []byte, err error) {
	if t.write || t.seen != nil || len(t.ops) > 0 {
		if ref, err = t.Get(b, k); err != nil || ref == nil {
			return ref, nil, err
		}
		v, err = t.Get(via, ref)
		return ref, v, err
	}
	if err := t.connect(); err != nil {
		return nil, nil, err
	}
	err = t.conn.QueryRow(t.ctx, throughSQL[b][via], k).Scan(&ref, &v)
	t.s.roundTrips.Add(1)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, t.failed(err)
	}
	return ref, v, nil
}

// GetThroughWith is GetThrough that also reads with's entry, as of the same
// moment (engine.ThroughWithGetter). Outside a transaction the three are
// read in one statement, which concurrent lookups share (lookup.go); a
// transaction reads them as Get does, in its snapshot or under its locks.
func (t *tx) GetThroughWith(b engine.Bucket, k []byte, via engine.Bucket, with engine.Read) (ref, v, withV []byte, err error) {
	if t.outside {
		ref, v, withV, err = t.s.lookupThroughWith(t.ctx, b, k, via, with)
		return ref, v, withV, t.failed(err)
	}
	if ref, v, err = t.GetThrough(b, k, via); err != nil || ref == nil {
		return ref, v, nil, err
	}
	withV, err = t.Get(with.Bucket, with.Key)
	return ref, v, withV, err
}

func (t *tx) GetMany(b engine.Bucket, keys [][]byte) ([][]byte, error) {
	out := make([][]byte, len(keys))
	var missing [][]byte
	for i, k := range keys {
		if e, ok := t.cached(b, k); ok {
			out[i] = e.v
			continue
		}
		missing = append(missing, k)
	}
	if len(missing) == 0 {
		return out, nil
	}
	if err := t.connect(); err != nil {
		return nil, err
	}
	rows, err := t.conn.Query(t.ctx, queries[b].getMany, byteaArray(missing))
	t.s.roundTrips.Add(1)
	if err != nil {
		return nil, t.failed(err)
	}
	found := map[string][]byte{}
	for rows.Next() {
		var k, v []byte
		if err := rows.Scan(&k, &v); err != nil {
			rows.Close()
			return nil, t.failed(err)
		}
		found[string(k)] = v
	}
	if err := rows.Err(); err != nil {
		return nil, t.failed(err)
	}
	for i, k := range keys {
		if _, ok := t.cached(b, k); ok {
			continue
		}
		if v, ok := found[string(k)]; ok {
			out[i] = v
		}
	}
	return out, nil
}

func (t *tx) Append(b engine.Bucket, prefix, v []byte) error {
	t.appends = append(t.appends, appended{b: b, prefix: bytes.Clone(prefix), v: bytes.Clone(v)})
	return nil
}

func (t *tx) Put(b engine.Bucket, k, v []byte) error {
	t.buffer(b, k, opPut, v)
	return nil
}

func (t *tx) Insert(b engine.Bucket, k, v []byte) error {
	t.buffer(b, k, opInsert, v)
	return nil
}

func (t *tx) Delete(b engine.Bucket, k []byte) error {
	t.buffer(b, k, opDelete, nil)
	return nil
}

func (t *tx) NextSequence(b engine.Bucket) (uint64, error) {
	var n int64
	err := t.conn.QueryRow(t.ctx, queries[b].nextval).Scan(&n)
	t.s.roundTrips.Add(1)
	return uint64(n), t.failed(err)
}

func (t *tx) LockKey(id string) error {
	if !t.write || t.locked[id] {
		return nil
	}
	var one int32
	if err := t.lockingRead(lockKeySQL, []byte(id), &one); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return t.failed(err)
	}
	t.markLocked(id)
	return nil
}

// lockingRead runs sql, which locks the row of k (FOR UPDATE), and scans its
// one column into dest, in one round trip. Under the store's lockBound the
// statement runs with statement_timeout set to lock_timeout, as a batch's lock
// statements do (plan.queue): lock_timeout bounds each lock a statement waits
// for, and a row's second waiter waits for two, the first waiter's place in
// the row's queue and then the holder.
func (t *tx) lockingRead(sql string, k []byte, dest any) error {
	t.s.roundTrips.Add(1)
	if t.s.lockBound == "" {
		return t.conn.QueryRow(t.ctx, sql, k).Scan(dest)
	}
	b := &pgx.Batch{}
	b.Queue(setLockWaitSQL, t.s.lockTimeoutParam, t.s.lockBound)
	b.Queue(sql, k)
	b.Queue(setLockWaitSQL, t.s.lockTimeoutParam, t.s.statementTimeoutParam)
	br := t.conn.SendBatch(t.ctx, b)
	_, err := br.Exec()
	var scanned error // the row's: pgx.ErrNoRows when there is none
	if err == nil {
		if scanned = br.QueryRow().Scan(dest); !errors.Is(scanned, pgx.ErrNoRows) {
			err, scanned = scanned, nil
		}
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "57014" {
		err = &lockTimedOut{err: err} // the statement_timeout set here
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = scanned
	}
	return err
}

func (t *tx) markLocked(id string) {
	if t.locked == nil {
		t.locked = map[string]bool{}
	}
	t.locked[id] = true
}

func (t *tx) Cursor(b engine.Bucket) engine.Cursor { return &cursor{t: t, b: b} }

// cursor reads its bucket in chunks of cursorChunk entries, forwards or
// backwards from where it stands. A failure is kept in the transaction, which
// then fails; the cursor returns nil as at the end.
type cursor struct {
	t       *tx
	b       engine.Bucket
	entries []entry // the chunk read last, in the direction read
	i       int     // the current entry in entries
	forward bool
	// more is set when the chunk was full: the bucket may go on beyond it.
	more bool
}

type entry struct{ k, v []byte }

func (c *cursor) First() ([]byte, []byte) {
	return c.load(true, queries[c.b].first, cursorChunk)
}

func (c *cursor) Last() ([]byte, []byte) {
	return c.load(false, queries[c.b].last, cursorChunk)
}

func (c *cursor) Seek(seek []byte) ([]byte, []byte) {
	return c.load(true, queries[c.b].from, bytes.Clone(seek), cursorChunk)
}

func (c *cursor) Next() ([]byte, []byte) {
	k, ok := c.current()
	if !ok {
		return nil, nil
	}
	if c.forward && c.i+1 < len(c.entries) {
		c.i++
		return c.entries[c.i].k, c.entries[c.i].v
	}
	if c.forward && !c.more {
		c.entries = nil
		return nil, nil
	}
	return c.load(true, queries[c.b].after, k, cursorChunk)
}

func (c *cursor) Prev() ([]byte, []byte) {
	k, ok := c.current()
	if !ok {
		return nil, nil
	}
	if !c.forward && c.i+1 < len(c.entries) {
		c.i++
		return c.entries[c.i].k, c.entries[c.i].v
	}
	if !c.forward && !c.more {
		c.entries = nil
		return nil, nil
	}
	return c.load(false, queries[c.b].before, k, cursorChunk)
}

// current is the key the cursor stands on.
func (c *cursor) current() ([]byte, bool) {
	if c.i >= len(c.entries) {
		return nil, false
	}
	return c.entries[c.i].k, true
}

// load runs a chunk's query and stands on its first entry.
func (c *cursor) load(forward bool, sql string, args ...any) ([]byte, []byte) {
	c.entries, c.i, c.forward, c.more = nil, 0, forward, false
	t := c.t
	if t.err != nil {
		return nil, nil
	}
	if err := t.flush(); err != nil {
		t.err = t.failed(err)
		return nil, nil
	}
	if err := t.connect(); err != nil {
		t.err = err
		return nil, nil
	}
	rows, err := t.conn.Query(t.ctx, sql, args...)
	t.s.roundTrips.Add(1)
	if err != nil {
		t.err = t.failed(err)
		return nil, nil
	}
	for rows.Next() {
		var e entry
		if err := rows.Scan(&e.k, &e.v); err != nil {
			rows.Close()
			t.err = t.failed(err)
			return nil, nil
		}
		c.entries = append(c.entries, e)
	}
	if err := rows.Err(); err != nil {
		t.err = t.failed(err)
		return nil, nil
	}
	c.more = len(c.entries) == cursorChunk
	if len(c.entries) == 0 {
		return nil, nil
	}
	return c.entries[0].k, c.entries[0].v
}
