package web

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/google/uuid"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/static"
	"github.com/idemgate/idemgate/web/logging"
)

type ctxKey int

const (
	principalKey ctxKey = iota
	requestIDKey
)

// apiAuth authenticates the Bearer API key of docs/reference.md §4 and stores the tenant's principal for
// principal(c). The key is checked first, so a valid key is never refused for the failures of
// others at the same address (authFailureLimiter); failed authentications are counted per client
// address, and once the address is over the limit its failures answer 429 instead of 401, keys
// that already failed from it without a lookup. Errors: services.ErrUnauthorized,
// services.ErrRateLimited, services.ErrStoreUnavailable.
func apiAuth(auth *services.Auth, lim *authFailureLimiter) fiber.Handler {
	return func(c *fiber.Ctx) error {
		addr := c.IP()
		scheme, token, ok := strings.Cut(c.Get(fiber.HeaderAuthorization), " ")
		token = strings.TrimSpace(token)
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			token = ""
		}
		if wait, known := lim.knownBad(addr, token); known {
			return refuseRateLimited(c, wait)
		}
		var p services.Principal
		var err error = services.ErrUnauthorized
		if token != "" {
			p, err = auth.Authenticate(c.UserContext(), token)
		}
		if errors.Is(err, services.ErrUnauthorized) {
			// Only refused keys count: a database outage is not the client's failure. The
			// failure that reaches the limit is still told 401; the ones after it 429.
			wait, limited := lim.limited(addr)
			if lim.fail(addr, token) {
				lim.log.WarnContext(c.UserContext(), "API authentication failures rate limited", "ip", addr)
			}
			if limited {
				return refuseRateLimited(c, wait)
			}
			return err
		} else if err != nil {
			return err
		}
		c.Locals(principalKey, p)
		return c.Next()
	}
}

// storeDeadline gives the request's context a deadline of the server's store timeout, so every
// database call of the request (authentication, sessions, the handler's own) ends by then. A
// call cut off by it fails with context.DeadlineExceeded, which the error handler answers 503
// store_unavailable with Retry-After. That is also the answer when the deadline hits an
// acquire's commit and idemgate cannot know whether it took effect: the client retries with
// its attempt_id, which is admitted again either way, rather than being told 201 or 200.
//
// The request's own context comes back once the handlers return: the error page is rendered
// after the deadline has passed, and rendering must not fail for it.
func (s *Server) storeDeadline(c *fiber.Ctx) error {
	parent := c.UserContext()
	ctx, cancel := context.WithTimeout(parent, s.storeTimeout)
	defer cancel()
	c.SetUserContext(ctx)
	defer c.SetUserContext(parent)
	return c.Next()
}

// identityEncoding refuses request bodies with a Content-Encoding: Fiber would inflate them
// behind BodyLimit's back (a 51 KB gzip body became 50 MB in memory), and no client of a JSON
// API this small needs compression on the way in.
func identityEncoding(c *fiber.Ctx) error {
	if enc := c.Get(fiber.HeaderContentEncoding); enc != "" && !strings.EqualFold(enc, "identity") {
		return &services.Error{Code: services.CodeInvalidRequest,
			Message: "Content-Encoding is not supported on requests; send the body uncompressed."}
	}
	return c.Next()
}

// principal returns the caller authenticated by apiAuth. Routes without apiAuth never call it;
// a zero principal (tenant 0) matches nothing, so a wiring mistake fails closed.
func principal(c *fiber.Ctx) services.Principal {
	p, _ := c.Locals(principalKey).(services.Principal)
	return p
}

// requestID returns the request's id as assignRequestID set it, or "" for a request refused
// by the HTTP server before any middleware ran.
func requestID(c *fiber.Ctx) string {
	if v, ok := c.Locals(requestIDKey).(string); ok {
		return v
	}
	return ""
}

// assignRequestID gives the request its id: the client's X-Request-ID when it is a safe one
// (logging.ValidRequestID: at most 64 characters of letters, digits and ._~:@+/-), so a
// caller can follow its own id through our logs, else a new random UUID. The id is sent back
// in X-Request-ID, is in every problem+json body and error page (request_id), and is put in
// the request's context (c.UserContext()), where logging.NewHandler adds it to every line
// logged with that context. Fiber's requestid middleware is not used: it takes any inbound
// value, of any length and content, as is.
func assignRequestID(c *fiber.Ctx) error {
	rid := c.Get(fiber.HeaderXRequestID)
	if logging.ValidRequestID(rid) {
		rid = strings.Clone(rid) // it outlives the request in the context of background work
	} else {
		rid = uuid.NewString()
	}
	c.Set(fiber.HeaderXRequestID, rid)
	c.Locals(requestIDKey, rid)
	c.SetUserContext(logging.ContextWithRequestID(c.UserContext(), rid))
	return c.Next()
}

// observe wraps every routed request: it turns an error of the chain into its response right
// here (errorHandler), as Fiber's logger middleware does, so that it sees the final status;
// then it records the request in idemgate_http_request_duration_seconds and writes the access
// log line.
func (s *Server) observe(c *fiber.Ctx) error {
	start := time.Now()
	if err := c.Next(); err != nil {
		if err := s.errorHandler(c, err); err != nil {
			_ = c.SendStatus(fiber.StatusInternalServerError)
		}
	}
	elapsed := time.Since(start)
	status := c.Response().StatusCode()
	route := routeLabel(c, status)
	observeLatency(c.UserContext(), s.metrics.requests.WithLabelValues(route, methodLabel(c.Method()), strconv.Itoa(status)), elapsed.Seconds())
	s.logAccess(c.UserContext(), c, route, status, elapsed, true)
	return nil
}

// maxLoggedPath bounds the path in an access line; a longer one is cut and marked.
const maxLoggedPath = 256

// quietPaths are logged at Debug rather than Info when they succeed: probes and scrapes every
// few seconds would drown everything else. Static assets are quiet too (see logAccess).
var quietPaths = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true}

// logAccess writes the one access line of a request: method, route pattern, path (as sent,
// still percent-encoded, never the query string: /login?next=… and filters stay out of the
// log), status, duration, response bytes (-1 when streamed) and client address. request_id
// comes from ctx. Headers are never logged, so neither are API keys, owner tokens (request
// bodies) or cookies. parsed is false for a request the HTTP server refused before it could
// read the request line and headers: method and path are then logged as "-", not as Fiber's
// defaults (GET /), which would name a request that was never made.
func (s *Server) logAccess(ctx context.Context, c *fiber.Ctx, route string, status int, elapsed time.Duration, parsed bool) {
	path := c.Request().URI().PathOriginal()
	if i := bytes.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	logged, method := string(path), methodLabel(c.Method()) // copies: the buffer is reused after the request
	if !parsed {
		logged, method = "-", "-"
	}
	if len(logged) > maxLoggedPath {
		logged = logged[:maxLoggedPath] + "…"
	}
	level := slog.LevelInfo
	if status < 400 && (quietPaths[logged] || route == static.Prefix) {
		level = slog.LevelDebug
	}
	if !s.log.Enabled(ctx, level) {
		return
	}
	size := int64(-1)
	if resp := c.Response(); !resp.IsBodyStream() {
		// Body() of a streamed response would read the whole stream; never call it then.
		size = int64(len(resp.Body()))
	}
	s.log.LogAttrs(ctx, level, "request",
		slog.String("method", method),
		slog.String("route", route),
		slog.String("path", logged),
		slog.Int("status", status),
		slog.Float64("duration_ms", float64(elapsed.Microseconds())/1000),
		slog.Int64("bytes", size),
		slog.String("ip", c.IP()),
	)
}

// logPanic logs a panic recovered from a handler with its stack; the recovered error then
// becomes a 500 problem like any internal error.
func (s *Server) logPanic(c *fiber.Ctx, v any) {
	s.log.ErrorContext(c.UserContext(), "panic while handling a request", "panic", fmt.Sprint(v),
		"stack", string(debug.Stack()))
}
