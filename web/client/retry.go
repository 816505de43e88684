package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Defaults of RetryPolicy's zero fields.
const (
	DefaultMaxAttempts = 4
	DefaultBaseDelay   = 100 * time.Millisecond
	DefaultMaxDelay    = 2 * time.Second
	DefaultTryTimeout  = 10 * time.Second
)

// RetryPolicy says how a call is retried. Zero fields take the Default… values, so the zero
// RetryPolicy is the default policy; RetryPolicy{MaxAttempts: 1} turns retries off.
//
// A call is retried only where that is safe, which for this client is every method:
// Acquire always sends an attempt_id (so a retry after a lost 201 gets the same operation
// back, docs/reference.md §4), Release and RecordOutcome are owner-checked compare-and-set operations
// that cannot act twice, and reads change nothing. It is retried on a network error or a
// per-try timeout, and on 429, 502, 503 and 504 answers; never on any other answer, which
// is the server's decision. The wait before try n+1 is "full jitter": uniformly random in
// [0, min(MaxDelay, BaseDelay·2ⁿ⁻¹)], but at least the answer's Retry-After. A call gives up
// early, returning the last error, when the next wait would outlast its context's deadline.
type RetryPolicy struct {
	// MaxAttempts is the number of tries per call, the first included. Default 4.
	MaxAttempts int
	// BaseDelay is the cap of the first backoff. Default 100 ms.
	BaseDelay time.Duration
	// MaxDelay caps every backoff (not Retry-After). Default 2 s.
	MaxDelay time.Duration
	// TryTimeout bounds each try; a try that times out is retried. Default 10 s; negative
	// means no per-try bound (the call's context and WithTimeout still apply).
	TryTimeout time.Duration
}

// RetryEvent describes a failed try that is about to be retried, for WithRetryNotify.
type RetryEvent struct {
	Method string        // HTTP method of the call
	Path   string        // path of the call, e.g. "/v1/acquire"
	Try    int           // the try that failed, from 1
	Err    error         // why it failed: a *Problem or a network error
	Delay  time.Duration // how long the client waits before the next try
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.BaseDelay <= 0 {
		p.BaseDelay = DefaultBaseDelay
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = DefaultMaxDelay
	}
	if p.MaxDelay < p.BaseDelay {
		p.MaxDelay = p.BaseDelay
	}
	if p.TryTimeout == 0 {
		p.TryTimeout = DefaultTryTimeout
	}
	return p
}

// backoff returns the wait schedule of one call. backoff.ExponentialBackOff draws each wait
// uniformly from [cur·(1−f), cur·(1+f)]; with randomization factor f = 1 and the intervals
// halved that is exactly full jitter: [0, min(MaxDelay, BaseDelay·2ⁿ⁻¹)].
func (p RetryPolicy) backoff() backoff.BackOff {
	b := &backoff.ExponentialBackOff{
		InitialInterval:     p.BaseDelay / 2,
		RandomizationFactor: 1,
		Multiplier:          2,
		MaxInterval:         p.MaxDelay / 2,
		MaxElapsedTime:      0, // the context and MaxAttempts bound a call
		Stop:                backoff.Stop,
		Clock:               backoff.SystemClock,
	}
	b.Reset()
	return b
}

// Temporary reports whether err, returned by a call of this client, is a failure that a later
// call may get past: no complete answer (a refused or reset connection, a timeout) or a 429,
// 502, 503 or 504 answer. The client retries such failures itself within RetryPolicy; a
// caller that must not give up so soon (fibermw's outcome write, which would otherwise leave
// its key in progress until the TTL) calls again while this holds.
func Temporary(err error) bool { return err != nil && retryable(context.Background(), err) }

// retryable reports whether a failed try may be retried. ctx is the call's context: once it
// is done nothing is retried.
func retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var p *Problem
	if errors.As(err, &p) {
		return p.Temporary()
	}
	var te *transportError
	if !errors.As(err, &te) {
		return false
	}
	// A certificate the client refuses is refused again; everything else at the transport
	// level (refused or reset connections, a lost answer, a per-try timeout) may go through.
	var (
		unknownAuthority x509.UnknownAuthorityError
		hostname         x509.HostnameError
		invalid          x509.CertificateInvalidError
		verify           *tls.CertificateVerificationError
	)
	return !errors.As(err, &unknownAuthority) && !errors.As(err, &hostname) && !errors.As(err, &invalid) &&
		!errors.As(err, &verify)
}

// transportError is a try that got no complete answer: the request may or may not have
// reached the server.
type transportError struct{ err error }

func (e *transportError) Error() string { return e.err.Error() }
func (e *transportError) Unwrap() error { return e.err }
