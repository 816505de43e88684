// Package proxy is `idemgate proxy`: a reverse proxy that gives any HTTP service, in any
// language, the Idempotency-Key handling of the Fiber middleware (web/client/fibermw) with no
// change to the service. It sits in front of the service (the upstream) and admits every
// request that carries an Idempotency-Key through an idemgate server, with the same engine as
// fibermw: fingerprint, stored response, wait-and-replay, leases. docs/reference.md "The proxy"
// is its contract; the rules per status class are in Handler.
//
// Requests on a guarded method (POST and PATCH by default) with a key:
//   - the first is forwarded once, and its response (status, an allow-list of headers, the
//     body up to fibermw's limit) is recorded as the operation's outcome;
//   - a repeat gets that response again with Idempotent-Replayed: true; a repeat while the
//     first is in flight gets 409 request_in_progress, or waits for it and replays with
//     Config.Wait;
//   - the same key with another request (method, path, query, media type, canonical body, and
//     the Authorization header) gets 422;
//   - a request forwarded whose answer was lost (a timeout, a reset connection) or answered
//     5xx leaves the operation uncertain: repeats get 409 outcome_uncertain and are never
//     forwarded again until it is reconciled (or its TTL ends, when the next admission carries
//     the warning);
//   - keys are scoped by idemgate tenant (the API key), method and path, and with
//     Config.CallerHeader by a hash of that header's value, so two callers' same key never
//     collide.
//
// An admitted request reaches the upstream with its operation id, fencing token and, when the
// key's previous attempt did not end cleanly, that attempt's id, state and receipt, in the
// Idempotency-* request headers (Header…). Everything else (other methods, requests without a
// key on routes that do not require one) is forwarded untouched, but for those headers, which
// only the proxy sets.
package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gofiber/fiber/v2"
	fiberproxy "github.com/gofiber/fiber/v2/middleware/proxy"
	"github.com/idemgate/idemgate/web/client"
	"github.com/idemgate/idemgate/web/client/fibermw"
	"github.com/valyala/fasthttp"
)

// Problem codes of the proxy's own answers, besides fibermw's (fibermw.Code…).
const (
	// CodeUpstreamUnreachable (502): the upstream could not be connected to, so the request
	// was not sent; the key is released and a retry is forwarded again.
	CodeUpstreamUnreachable = "upstream_unreachable"
	// CodeUpstreamAnswerLost (502): the request was sent but no answer came (timeout, reset):
	// the upstream may have acted, so the operation is uncertain.
	CodeUpstreamAnswerLost = "upstream_answer_lost"
)

// Config configures a proxy. Upstream and Client are required.
type Config struct {
	// Upstream is the service's base URL, http://host:port (a path prefix is kept).
	Upstream string
	// Client talks to idemgate; its API key decides the tenant.
	Client *client.Client
	// Methods are the guarded methods. Default POST and PATCH.
	Methods []string
	// RequireKey lists path prefixes ("/v1/charges") whose guarded requests must carry
	// Idempotency-Key: without one they get 400 idempotency_key_missing. Elsewhere a guarded
	// request without a key is forwarded unguarded.
	RequireKey []string
	// CallerHeader, when set (e.g. "Authorization"), scopes keys by the SHA-256 of that
	// request header's value as well, so two callers' equal keys are two keys.
	CallerHeader string
	// ReplayHeaders are the upstream response headers stored and replayed with a repeat's
	// answer, besides the body and status. Default fibermw.DefaultReplayHeaders (Content-Type,
	// Location, ETag, …; never Set-Cookie).
	ReplayHeaders []string
	// DocumentationURL is fibermw's: the page documenting the service's idempotency rules,
	// linked from every answer of the proxy's own (Link rel="describedby").
	DocumentationURL string
	// TTL, Lease and Wait are fibermw's (Config.TTL default 24 h; Lease 0: the TTL; Wait 0:
	// a repeat in flight gets 409 at once).
	TTL, Lease, Wait time.Duration
	// NoEffect5xx lists upstream statuses of 500 and above that mean the request was not
	// processed (e.g. 503 from a service that sheds load before doing anything): the key is
	// released and a retry is forwarded again. Every other 5xx leaves the operation uncertain.
	NoEffect5xx []int
	// UpstreamTimeout bounds one forwarded request, from sending to the whole answer.
	// Default 30 s. A guarded request that hits it is uncertain.
	UpstreamTimeout time.Duration
	// Logger receives idemgate failures. Default slog.Default().
	Logger *slog.Logger
}

// New returns the proxy as a Fiber app, to serve with app.Listener or app.Listen.
// Errors: an Upstream that is not an absolute http(s) URL, a nil Client, a status in
// NoEffect5xx outside 500–599, a negative duration, a TTL or Lease that is not whole seconds.
func New(cfg Config) (*fiber.App, error) {
	u, err := url.Parse(cfg.Upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("upstream %q: want an absolute http:// or https:// URL", cfg.Upstream)
	}
	if cfg.Client == nil {
		return nil, errors.New("proxy: no idemgate client")
	}
	for name, d := range map[string]time.Duration{"ttl": cfg.TTL, "lease": cfg.Lease, "wait": cfg.Wait} {
		if d < 0 || (name != "wait" && d%time.Second != 0) {
			return nil, fmt.Errorf("%s %s: want whole seconds, 0 or more", name, d)
		}
	}
	noEffect := map[int]bool{}
	for _, s := range cfg.NoEffect5xx {
		if s < 500 || s > 599 {
			return nil, fmt.Errorf("no-effect status %d: want 500-599", s)
		}
		noEffect[s] = true
	}
	if cfg.UpstreamTimeout <= 0 {
		cfg.UpstreamTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	h := &handler{upstream: strings.TrimSuffix(u.String(), "/"), noEffect: noEffect, timeout: cfg.UpstreamTimeout,
		// A POST or PATCH is never sent twice by the proxy itself: fasthttp retries only
		// idempotent methods, and one attempt is all it gets anyway.
		client: &fasthttp.Client{MaxIdemponentCallAttempts: 1, NoDefaultUserAgentHeader: true,
			DisablePathNormalizing: true, ReadTimeout: cfg.UpstreamTimeout, WriteTimeout: cfg.UpstreamTimeout}}
	app := fiber.New(fiber.Config{DisableStartupMessage: true, BodyLimit: 16 << 20, ReadTimeout: cfg.UpstreamTimeout,
		// The upstream's own error pages pass through; only the proxy's answers are its own.
		ErrorHandler: func(c *fiber.Ctx, err error) error {
			return fibermw.WriteProblem(c, &fibermw.Problem{Type: "about:blank", Title: "Bad Gateway",
				Status: fiber.StatusBadGateway, Code: CodeUpstreamAnswerLost, Detail: err.Error()})
		}})
	app.Use(fibermw.New(fibermw.Config{
		Client: cfg.Client, Methods: cfg.Methods, TTL: cfg.TTL, Lease: cfg.Lease, Wait: cfg.Wait, Logger: cfg.Logger,
		ReplayHeaders: cfg.ReplayHeaders, DocumentationURL: cfg.DocumentationURL,
		Required: func(c *fiber.Ctx) bool {
			for _, p := range cfg.RequireKey {
				if strings.HasPrefix(c.Path(), p) {
					return true
				}
			}
			return false
		},
		Scope: func(c *fiber.Ctx) string { return scope(c, cfg.CallerHeader) },
	}))
	app.All("/*", h.forward)
	return app, nil
}

// scope is a request's key scope at idemgate: method and path, and the caller's hash when
// header is set and the request carries it ("POST /v1/charges caller=3f2a…").
func scope(c *fiber.Ctx, header string) string {
	s := c.Method() + " " + c.Path()
	if v := c.Get(header); header != "" && v != "" { // without the header: the anonymous caller
		sum := sha256.Sum256([]byte(v))
		s += " caller=" + hex.EncodeToString(sum[:8])
	}
	return s
}

type handler struct {
	upstream string
	noEffect map[int]bool
	timeout  time.Duration
	client   *fasthttp.Client
}

// forward sends the request to the upstream and leaves its response on c for fibermw to
// record. A request that never left (the upstream refused the connection, or the dial timed
// out) is no effect: 502 upstream_unreachable, key released. One that left and got no answer is
// 502 upstream_answer_lost, uncertain. A 5xx listed in Config.NoEffect5xx is no effect.
func (h *handler) forward(c *fiber.Ctx) error {
	passAdmission(c)
	err := fiberproxy.DoTimeout(c, h.upstream+c.OriginalURL(), h.timeout, h.client)
	if err != nil {
		if notSent(err) {
			fibermw.NoEffect(c)
			return fibermw.WriteProblem(c, &fibermw.Problem{Type: "about:blank", Title: "Bad Gateway",
				Status: fiber.StatusBadGateway, Code: CodeUpstreamUnreachable,
				Detail: "The upstream could not be reached; the request was not sent. Retry with the same key."})
		}
		return fibermw.WriteProblem(c, &fibermw.Problem{Type: "about:blank", Title: "Bad Gateway",
			Status: fiber.StatusBadGateway, Code: CodeUpstreamAnswerLost,
			Detail: "The request was sent but its answer was lost; the upstream may have acted. Its outcome is unknown until reconciled."})
	}
	if h.noEffect[c.Response().StatusCode()] {
		fibermw.NoEffect(c)
	}
	return nil
}

// Request headers the proxy sets for the upstream on an admitted request (docs/reference.md
// §12), and removes from every request, so that a client can never send them itself.
const (
	// HeaderOperation is the admitted attempt's idemgate operation id.
	HeaderOperation = "Idempotency-Operation-Id"
	// HeaderFencingToken is its fencing token: 1 for the key's first admission, one more for
	// each later one. Pass it to destinations that can reject stale attempts.
	HeaderFencingToken = "Idempotency-Fencing-Token"
	// HeaderPreviousOperation, HeaderPreviousState and HeaderPreviousReceipt carry the key's
	// previous operation when it did not end cleanly (uncertain, or succeeded and admitted
	// again after its TTL): check the destination before acting again.
	HeaderPreviousOperation = "Idempotency-Previous-Operation"
	HeaderPreviousState     = "Idempotency-Previous-State"
	HeaderPreviousReceipt   = "Idempotency-Previous-Receipt"
)

// passAdmission tells the upstream what idemgate decided: the warning of a previous attempt
// that did not end cleanly must reach the code that performs the effect, or the proxy would
// lose it (fibermw hands it to Go handlers as Info.PreviousOperation).
func passAdmission(c *fiber.Ctx) {
	h := &c.Request().Header
	for _, name := range []string{HeaderOperation, HeaderFencingToken, HeaderPreviousOperation, HeaderPreviousState,
		HeaderPreviousReceipt} {
		h.Del(name)
	}
	info, ok := fibermw.FromContext(c)
	if !ok {
		return
	}
	h.Set(HeaderOperation, info.OperationID)
	h.Set(HeaderFencingToken, strconv.FormatInt(info.FencingToken, 10))
	if prev := info.PreviousOperation; prev != nil {
		h.Set(HeaderPreviousOperation, prev.ID)
		h.Set(HeaderPreviousState, prev.State)
		if prev.Outcome != nil && prev.Outcome.Receipt != "" {
			h.Set(HeaderPreviousReceipt, prev.Outcome.Receipt)
		}
	}
}

// notSent reports whether err means the request cannot have reached the upstream: the
// connection was refused or could not be made in time. Anything else (a reset, a timeout
// waiting for the answer, a connection closed before the first byte) may come after the
// upstream read the request.
func notSent(err error) bool {
	if errors.Is(err, fasthttp.ErrDialTimeout) || errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
