package web

import (
	"bytes"
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
)

// authFailureLimiter counts failed API-key authentications per client address in fixed
// windows. Only failures count, so a busy client with a valid key never reaches the limit.
// Once an address has failed authFailures times in a window, every API request from it is
// refused with 429 rate_limited until the window ends, whatever key it carries: letting valid
// keys through would mean checking each guess, which is what the limit is there to stop.
//
// The count is in process memory, so each instance counts on its own: with N instances an
// address gets up to N×authFailures attempts per window. The address is the TCP peer (c.IP());
// behind a reverse proxy all clients share the proxy's address and its limit.
//
// Fiber's limiter middleware is not used because its SkipSuccessfulRequests looks at the
// response status when the chain returns, before the error handler has turned an error into
// 401, so returned errors would count as successes and handlers' own 4xx as failures.
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
}

func newAuthFailureLimiter(log *slog.Logger) *authFailureLimiter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &authFailureLimiter{max: authFailures, window: authFailureWindow, now: time.Now, log: log,
		addrs: map[string]*failureWindow{}}
}

// blocked returns how long addr must wait, and whether it is blocked now.
func (l *authFailureLimiter) blocked(addr string) (time.Duration, bool) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	w, ok := l.addrs[addr]
	if !ok {
		return 0, false
	}
	end := w.start.Add(l.window)
	if !now.Before(end) {
		delete(l.addrs, addr)
		return 0, false
	}
	return end.Sub(now), w.n >= l.max
}

// fail records one failed authentication from addr and reports whether it reached the limit
// with this failure (for a single log line per window).
func (l *authFailureLimiter) fail(addr string) bool {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	w, ok := l.addrs[addr]
	if !ok || !now.Before(w.start.Add(l.window)) {
		if !ok && len(l.addrs) >= maxTrackedAddrs {
			l.prune(now)
		}
		w = &failureWindow{start: now}
		l.addrs[addr] = w
	}
	w.n++
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
