package awsfront

import (
	"sync"
	"sync/atomic"
)

// progress is what a checked body reports while the transport's goroutine
// may still be reading it: bytes checked and the failed check.
type progress struct {
	decoded atomic.Int64
	mu      sync.Mutex
	err     error
}

// Decoded counts the payload bytes checked so far.
func (p *progress) Decoded() int64 { return p.decoded.Load() }

// Err is the check that failed, nil while none has.
func (p *progress) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// fail records err as the body's failure and returns it.
func (p *progress) fail(err error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err == nil {
		p.err = err
	}
	return p.err
}
