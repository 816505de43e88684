package web

import (
	"bytes"
	"crypto/sha256"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/services"
)

// apiContentSecurityPolicy is the policy of every response that is not a dashboard page: JSON,
// metrics, static files, redirects and errors load nothing and may not be framed. Dashboard
// pages replace it with contentSecurityPolicy (setPageHeaders).
const apiContentSecurityPolicy = "default-src 'none'; frame-ancestors 'none'"

// setSecurityHeaders sets the security headers every response carries (issue 4). It is a
// small function rather than Fiber's helmet middleware because the error handler must also
// call it for errors the HTTP server raises before any middleware ran (431, chunked bodies
// over the limit), and helmet is only available as a handler.
func setSecurityHeaders(c *fiber.Ctx) {
	c.Set(fiber.HeaderContentSecurityPolicy, apiContentSecurityPolicy)
	c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	c.Set(fiber.HeaderReferrerPolicy, "no-referrer")
	c.Set(fiber.HeaderXFrameOptions, "DENY")
	c.Set("Cross-Origin-Resource-Policy", "same-origin")
}

// securityHeaders is the first middleware of the application. It sets the defaults before
// calling the rest of the chain, so dashboard handlers (setPageHeaders) override them with the
// page policy and nothing overwrites theirs afterwards.
func securityHeaders(c *fiber.Ctx) error {
	setSecurityHeaders(c)
	return c.Next()
}

// rejectAmbiguousLength refuses a request whose body length is ambiguous, and closes the
// connection after the answer, since where this request ends (and the next begins) is not known:
//   - Content-Length more than once with different values (RFC 9112 §6.3: a recipient must treat
//     it as unrecoverable). The HTTP server silently takes the last one; a proxy that takes the
//     first would see another request boundary than idemgate.
//   - Content-Length together with Transfer-Encoding (RFC 9112 §6.1: the server must close the
//     connection after such a request). The HTTP server reads the body as chunked; a proxy that
//     honours Content-Length instead would take the rest of the chunked body for a pipelined
//     request of its own.
//
// Both are the basis of request smuggling.
func rejectAmbiguousLength(c *fiber.Ctx) error {
	// The parsed header keeps one Content-Length and folds Transfer-Encoding into "chunked";
	// the raw header block keeps every line as received.
	lengths, transferEncoding := framingHeaders(c.Request().Header.RawHeaders())
	switch {
	case lengths > 1:
		c.Context().SetConnectionClose()
		return fieldError(fiber.HeaderContentLength,
			"must appear once (two different lengths make the end of the request ambiguous)")
	case lengths > 0 && transferEncoding:
		c.Context().SetConnectionClose()
		return fieldError(fiber.HeaderContentLength,
			"must not be sent with Transfer-Encoding (the two make the end of the request ambiguous)")
	}
	return c.Next()
}

// framingHeaders reads raw request headers ("Name: value\r\n" lines, as received): the number
// of distinct Content-Length values, and whether any Transfer-Encoding line is present.
func framingHeaders(raw []byte) (lengths int, transferEncoding bool) {
	values := map[string]bool{}
	for _, line := range bytes.Split(raw, []byte("\n")) {
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		name = bytes.TrimSpace(name)
		switch {
		case bytes.EqualFold(name, []byte(fiber.HeaderContentLength)):
			values[string(bytes.TrimSpace(value))] = true
		case bytes.EqualFold(name, []byte(fiber.HeaderTransferEncoding)):
			transferEncoding = true
		}
	}
	return len(values), transferEncoding
}

// Failed API-key authentications allowed per client address per authFailureWindow.
const (
	authFailures      = 20
	authFailureWindow = time.Minute
	// maxTrackedAddrs bounds the failure table; when full, expired windows are dropped and, if
	// that is not enough, the table is emptied (an attacker with that many addresses is not
	// stopped by a per-address limit anyway).
	maxTrackedAddrs = 100_000
	// maxBadKeysPerAddr bounds the bad keys remembered per address; further ones are still
	// refused with 429, only after a lookup.
	maxBadKeysPerAddr = 64
)

// authFailureLimiter counts failed API-key authentications per client address in fixed
// windows. Only failures count, so a busy client with a valid key never reaches the limit, and
// only failures are limited: once an address has failed authFailures times in a window, its
// further failures answer 429 rate_limited (with Retry-After) instead of 401 until the window
// ends, but a valid key from it is still let through. One misconfigured service behind a NAT or
// a reverse proxy, where many clients share an address, must not lock out every tenant there.
//
// The key is therefore checked before the limit is applied. What the limit protects is the
// database and the logs from a client that keeps presenting bad keys: a limited address's keys
// that already failed in this window (remembered by their SHA-256, at most maxBadKeysPerAddr)
// are refused from memory without a lookup, and the limit is logged once per window. It does
// not slow a guesser who sends a new key each time (each is one indexed lookup by hash, as for
// any request): refusing unknown keys from a limited address unchecked would refuse the valid
// keys of its neighbours, and guessing cannot succeed anyway, since API keys are random secrets
// of at least 144 bits (256 when generated). A key that failed and is created afterwards (only a
// supplied bootstrap key can be) is refused from that address until the window ends.
//
// The count is in process memory, so each instance counts on its own. The address is the TCP
// peer (c.IP()); behind a reverse proxy all clients share the proxy's address.
//
// Fiber's limiter middleware is not used because it decides before the handler whether to
// refuse, whatever the key, and its SkipSuccessfulRequests looks at the response status when
// the chain returns, before the error handler has turned an error into 401, so returned errors
// would count as successes and handlers' own 4xx as failures.
type authFailureLimiter struct {
	max    int
	window time.Duration
	now    func() time.Time
	log    *slog.Logger

	mu    sync.Mutex
	addrs map[string]*failureWindow
}

type failureWindow struct {
	start  time.Time
	n      int
	logged bool
	// bad holds the hashes of the keys that failed from this address in this window.
	bad map[[sha256.Size]byte]bool
}

func newAuthFailureLimiter(log *slog.Logger) *authFailureLimiter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &authFailureLimiter{max: authFailures, window: authFailureWindow, now: time.Now, log: log,
		addrs: map[string]*failureWindow{}}
}

// current returns addr's window if it is still open, dropping an expired one. l.mu is held.
func (l *authFailureLimiter) current(addr string, now time.Time) *failureWindow {
	w, ok := l.addrs[addr]
	if !ok {
		return nil
	}
	if !now.Before(w.start.Add(l.window)) {
		delete(l.addrs, addr)
		return nil
	}
	return w
}

// limited returns how long addr's window still runs, and whether addr is over the limit now.
func (l *authFailureLimiter) limited(addr string) (time.Duration, bool) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.current(addr, now)
	if w == nil {
		return 0, false
	}
	return w.start.Add(l.window).Sub(now), w.n >= l.max
}

// knownBad reports whether addr is over the limit and already failed with this key (the
// presented secret) in the window: then it can be refused without a lookup. wait is how long
// the window still runs.
func (l *authFailureLimiter) knownBad(addr, key string) (wait time.Duration, known bool) {
	now := l.now()
	h := sha256.Sum256([]byte(key))
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.current(addr, now)
	if w == nil || w.n < l.max || !w.bad[h] {
		return 0, false
	}
	return w.start.Add(l.window).Sub(now), true
}

// fail records one failed authentication from addr with key (the presented secret, "" when
// none) and reports whether addr reached the limit with this failure (for a single log line
// per window).
func (l *authFailureLimiter) fail(addr, key string) bool {
	now := l.now()
	h := sha256.Sum256([]byte(key))
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.current(addr, now)
	if w == nil {
		if len(l.addrs) >= maxTrackedAddrs {
			l.prune(now)
		}
		w = &failureWindow{start: now, bad: map[[sha256.Size]byte]bool{}}
		l.addrs[addr] = w
	}
	w.n++
	if len(w.bad) < maxBadKeysPerAddr {
		w.bad[h] = true
	}
	if w.n >= l.max && !w.logged {
		w.logged = true
		return true
	}
	return false
}

// prune drops expired windows, or everything if none has expired. l.mu is held.
func (l *authFailureLimiter) prune(now time.Time) {
	for a, w := range l.addrs {
		if !now.Before(w.start.Add(l.window)) {
			delete(l.addrs, a)
		}
	}
	if len(l.addrs) >= maxTrackedAddrs {
		l.addrs = map[string]*failureWindow{}
	}
}

// refuseRateLimited answers a blocked address: 429 rate_limited with Retry-After in whole seconds.
func refuseRateLimited(c *fiber.Ctx, wait time.Duration) error {
	secs := int(math.Ceil(wait.Seconds()))
	if secs < 1 {
		secs = 1
	}
	c.Set(fiber.HeaderRetryAfter, strconv.Itoa(secs))
	return services.ErrRateLimited
}
