package engine

import (
	"context"
	"sync"
)

// Settles queued and not yet durable (SettleQueued). A settle queued on a store
// that group-commits returns before its transaction commits; a read transaction
// that began meanwhile would not see it. So that every read sees every settle
// queued before the read began — a capture's exposure read sees the creation
// its caller was just answered for, the admin API sees the holds the proxy
// settled — the reads wait for them first: a read of one key's state for that
// key's settles only, a read of the whole vault for all of them. They wait at
// most one commit, and not at all when nothing is queued (always on a store
// that settles before SettleQueued returns).

// pendingSettles counts the settles queued and made durable, for one key or for
// all. Settles finish in the order they were queued (the committer runs and
// commits operations in that order), so done reaching the queued count read at
// some moment means every settle queued before that moment is durable.
type pendingSettles struct {
	queued, done uint64
	// wake is closed, and forgotten, when done grows.
	wake chan struct{}
}

func (p *pendingSettles) finish() {
	p.done++
	if p.wake != nil {
		close(p.wake)
		p.wake = nil
	}
}

// settleQueue tracks the settles queued and not yet durable.
type settleQueue struct {
	mu   sync.Mutex
	all  pendingSettles
	keys map[string]*pendingSettles
}

// add counts a settle of keyID queued.
func (q *settleQueue) add(keyID string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.all.queued++
	p := q.keys[keyID]
	if p == nil {
		if q.keys == nil {
			q.keys = map[string]*pendingSettles{}
		}
		p = &pendingSettles{}
		q.keys[keyID] = p
	}
	p.queued++
}

// finish counts a settle of keyID durable (or failed, or never queued).
func (q *settleQueue) finish(keyID string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.all.finish()
	if p := q.keys[keyID]; p != nil {
		p.finish()
		if p.done == p.queued {
			delete(q.keys, keyID)
		}
	}
}

// wait returns once every settle of keyID ("" for every key) queued before it
// was called is durable, or with ctx's error.
func (q *settleQueue) wait(ctx context.Context, keyID string) error {
	q.mu.Lock()
	p := &q.all
	if keyID != "" {
		if p = q.keys[keyID]; p == nil {
			q.mu.Unlock()
			return nil
		}
	}
	// A key's entry leaves the map only once done caught up with queued, which
	// ends this loop: p stays the entry to watch.
	for target := p.queued; p.done < target; {
		if p.wake == nil {
			p.wake = make(chan struct{})
		}
		wake := p.wake
		q.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		}
		q.mu.Lock()
	}
	q.mu.Unlock()
	return nil
}
