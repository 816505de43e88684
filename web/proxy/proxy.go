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
// key's earlier attempt may have had its effect, that attempt's id, state and receipt, in the
// Idempotency-* request headers (Header…). Everything else (other methods, requests without a
// key on routes that do not require one) is forwarded untouched, but for those headers, which
// only the proxy sets, and streamed both ways.
package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/idemgate/idemgate/web/client"
	"github.com/idemgate/idemgate/web/client/fibermw"
	"github.com/idemgate/idemgate/web/internal/forward"
)

// Problem codes of the proxy's own answers, besides fibermw's (fibermw.Code…).
const (
	// CodeUpstreamUnreachable (502): the upstream could not be connected to, so the request
	// was not sent; the key is released and a retry is forwarded again.
	CodeUpstreamUnreachable = "upstream_unreachable"
	// CodeUpstreamAnswerLost (502): the request was sent but no whole answer came (timeout,
	// reset, an answer over MaxResponseBytes): the upstream may have acted, so the operation is
	// uncertain.
	CodeUpstreamAnswerLost = "upstream_answer_lost"
	// CodeRequestInvalid (400, 408, 413, 431): the request could not be read or forwarded
	// (malformed, too slow, too large); nothing reached the upstream.
	CodeRequestInvalid = "request_invalid"
)

// Config configures a proxy. Upstream and Client are required.
type Config struct {
	// Upstream is the service's base URL, http://host:port (a path prefix is kept).
	Upstream string
	// Client talks to idemgate; its API key decides the tenant.
	Client *client.Client
	// Methods are the guarded methods. Default POST and PATCH.
	Methods []string
	// RequireKey lists path prefixes ("/v1/charges", whole segments: not "/v1/charges-old")
	// whose guarded requests must carry Idempotency-Key: without one they get 400
	// idempotency_key_missing. Elsewhere a guarded request without a key is forwarded
	// unguarded.
	RequireKey []string
	// CallerHeader, when set (e.g. "Authorization"), scopes keys by the SHA-256 of that
	// request header's value as well, so two callers' equal keys are two keys.
	CallerHeader string
	// ReplayHeaders are the upstream response headers stored and replayed with a repeat's
	// answer, besides the body and status. Default fibermw.DefaultReplayHeaders (Content-Type,
	// Location, ETag, …; never Set-Cookie).
	ReplayHeaders []string
	// Operations name the business operation of guarded requests by path prefix (whole
	// segments; the longest match wins), e.g. {"/v1/charges", "charge.create"}: idemgate
	// records it with each operation, so the dashboard, the audit and the uncertain queue say
	// what a key was for. A request under no prefix has no operation name. ParseOperations
	// reads them from "PREFIX=NAME" strings.
	Operations []Operation
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
	// UpstreamTimeout bounds one forwarded guarded request, from sending to the whole answer,
	// and a pass-through one until its answer's headers (its body may stream for as long as it
	// lasts). Default 30 s. A guarded request that hits it is uncertain.
	UpstreamTimeout time.Duration
	// Logger receives one line per request (see logRequest) and idemgate failures. Default
	// slog.Default().
	Logger *slog.Logger
}

// Operation names the operation of the guarded requests under Prefix (Config.Operations).
type Operation struct {
	Prefix string
	// Name is an idemgate operation name: 1–64 characters of [A-Za-z0-9._:-]
	// (docs/reference.md §4).
	Name string
}

// ParseOperations reads Config.Operations from "PREFIX=NAME" strings (the proxy's --operation
// flag). Errors: an entry without "=", a prefix that does not start with "/", a name that is
// not an operation name, or a prefix given twice.
func ParseOperations(specs []string) ([]Operation, error) {
	var out []Operation
	seen := map[string]bool{}
	for _, spec := range specs {
		prefix, name, ok := strings.Cut(spec, "=")
		prefix = strings.TrimSuffix(strings.TrimSpace(prefix), "/")
		name = strings.TrimSpace(name)
		switch {
		case !ok:
			return nil, fmt.Errorf("operation %q: want PREFIX=NAME, e.g. /v1/charges=charge.create", spec)
		case !strings.HasPrefix(prefix+"/", "/"):
			return nil, fmt.Errorf("operation %q: the prefix must be a path starting with /", spec)
		case !client.ValidOperationName(name):
			return nil, fmt.Errorf("operation %q: the name must be 1 to %d characters of A-Z a-z 0-9 . _ : -",
				spec, client.MaxOperationNameChars)
		case seen[prefix]:
			return nil, fmt.Errorf("operation %q: prefix %q is named twice", spec, prefix+"/")
		}
		seen[prefix] = true
		out = append(out, Operation{Prefix: prefix, Name: name})
	}
	return out, nil
}

// operationName is the name of the longest of ops's prefixes path is under, or "".
func operationName(path string, ops []Operation) string {
	best, name := -1, ""
	for _, o := range ops {
		if underAny(path, []string{o.Prefix}) && len(o.Prefix) > best {
			best, name = len(o.Prefix), o.Name
		}
	}
	return name
}

// New returns the proxy as a Fiber app, to serve with app.Listener or app.Listen.
// Errors: an Upstream that is not an absolute http(s) URL, a nil Client, a status in
// NoEffect5xx outside 500–599, a negative duration, a TTL or Lease that is not whole seconds,
// a TTL not longer than UpstreamTimeout.
func New(cfg Config) (*fiber.App, error) {
	u, err := forward.ParseUpstream(cfg.Upstream)
	if err != nil {
		return nil, err
	}
	if cfg.Client == nil {
		return nil, errors.New("proxy: no idemgate client")
	}
	for name, d := range map[string]time.Duration{"ttl": cfg.TTL, "lease": cfg.Lease, "wait": cfg.Wait} {
		if d < 0 || (name != "wait" && d%time.Second != 0) {
			return nil, fmt.Errorf("%s %s: want whole seconds, 0 or more", name, d)
		}
	}
	for _, o := range cfg.Operations {
		if !client.ValidOperationName(o.Name) || !strings.HasPrefix(o.Prefix+"/", "/") {
			return nil, fmt.Errorf("operation %q=%q: want a path prefix and an operation name", o.Prefix, o.Name)
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
	if cfg.TTL != 0 && cfg.TTL <= cfg.UpstreamTimeout {
		// A hold that ends while its request is still at the upstream lets a repeat in.
		return nil, fmt.Errorf("ttl %s: want more than the upstream timeout (%s)", cfg.TTL, cfg.UpstreamTimeout)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if len(cfg.Methods) == 0 {
		cfg.Methods = []string{fiber.MethodPost, fiber.MethodPatch} // fibermw's default
	}
	guardedMethods := map[string]bool{}
	for _, m := range cfg.Methods {
		guardedMethods[strings.ToUpper(m)] = true
	}
	// No redirects followed (the caller gets them, and they are replayed), no proxy from the
	// environment, and the body passed on as sent: no Accept-Encoding of our own and no
	// decompression.
	newClient := func(headerTimeout time.Duration) *http.Client {
		return &http.Client{
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			Transport: &http.Transport{Proxy: nil, DisableCompression: true, MaxIdleConnsPerHost: 256,
				IdleConnTimeout: 90 * time.Second, DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
				ResponseHeaderTimeout: headerTimeout},
		}
	}
	h := &handler{upstream: u, noEffect: noEffect, timeout: cfg.UpstreamTimeout, client: newClient(0),
		passClient: newClient(cfg.UpstreamTimeout)}
	app := fiber.New(fiber.Config{DisableStartupMessage: true, BodyLimit: MaxRequestBytes,
		// Bodies over BodyLimit, and chunked ones, reach the handler as a stream instead of
		// being refused or read whole: pass-through requests are forwarded as they arrive,
		// and readGuarded bounds the guarded ones itself. A multipart form is not parsed: the
		// upstream gets its bytes, not fasthttp's re-encoding of them.
		StreamRequestBody: true, DisablePreParseMultipartForm: true,
		ReadTimeout: cfg.UpstreamTimeout,
		// Only Fiber's own refusals of a request it could not read (413 too large, 431, 400
		// malformed, 408 too slow) come here: forward answers its failures itself. None of them
		// reached the upstream.
		ErrorHandler: func(c *fiber.Ctx, err error) error {
			status := fiber.StatusBadRequest
			var fe *fiber.Error
			if errors.As(err, &fe) && fe.Code >= 400 && fe.Code < 500 {
				status = fe.Code
			}
			return fibermw.WriteProblem(c, &fibermw.Problem{Type: "about:blank", Title: http.StatusText(status),
				Status: status, Code: CodeRequestInvalid,
				Detail: "The request could not be read, so it was not forwarded: " + http.StatusText(status) + "."})
		}})
	// Whether fibermw guards the request (answers it itself or admits it); the rest passes
	// through, streamed.
	guarded := func(c *fiber.Ctx) bool {
		return guardedMethods[c.Method()] &&
			(len(c.Request().Header.PeekAll(fibermw.HeaderIdempotencyKey)) > 0 || underAny(requestPath(c), cfg.RequireKey))
	}
	app.Use(func(c *fiber.Ctx) error { return logRequest(c, cfg.Logger, guarded(c)) })
	app.Use(func(c *fiber.Ctx) error {
		if !guarded(c) {
			return c.Next()
		}
		return readGuarded(c)
	})
	app.Use(fibermw.New(fibermw.Config{
		Client: cfg.Client, Methods: cfg.Methods, TTL: cfg.TTL, Lease: cfg.Lease, Wait: cfg.Wait, Logger: cfg.Logger,
		ReplayHeaders: cfg.ReplayHeaders, DocumentationURL: cfg.DocumentationURL,
		Required: func(c *fiber.Ctx) bool {
			return underAny(requestPath(c), cfg.RequireKey)
		},
		Scope:     func(c *fiber.Ctx) string { return scope(c, cfg.CallerHeader) },
		Operation: func(c *fiber.Ctx) string { return operationName(requestPath(c), cfg.Operations) },
	}))
	app.All("/*", h.forward)
	return app, nil
}

// scope is a request's key scope at idemgate: method and path, and the caller's hash when
// header is set and the request carries it ("POST /v1/charges caller=3f2a…").
func scope(c *fiber.Ctx, header string) string {
	s := c.Method() + " " + requestPath(c)
	if header != "" {
		s += forward.CallerScope(c.Get(header))
	}
	return s
}

// underAny reports whether path is one of prefixes or below one, by whole segments:
// "/orders" covers "/orders" and "/orders/7", not "/orders-archive".
func underAny(path string, prefixes []string) bool {
	for _, p := range prefixes {
		p = strings.TrimSuffix(p, "/")
		if p == "" || path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

// requestPath is the request's path normalized as fasthttp does (percent-decoded, dot
// segments resolved, repeated slashes collapsed; RFC 3986 §6.2.2), the path fibermw
// fingerprints. The key scope, --require-key and the path forwarded are all this one, so two
// spellings of one path (/a, /./a, /b/../a, //a) are one key and one resource upstream; Fiber's
// c.Path() is the path as sent, and with it one key on three spellings ran three times.
func requestPath(c *fiber.Ctx) string { return string(c.Request().URI().Path()) }

// logRequest writes one line per request once it is answered: method, path (as sent, without
// the query, at most 256 bytes), status, duration, and for a guarded request what idemgate
// decided: "admitted" with the operation id and fencing token, "replayed", or the code of the
// problem it was answered with (request_in_progress, outcome_uncertain, …). An admission that
// carries the warning of docs/reference.md §4 (an earlier attempt may have had its effect) is
// logged at Warn with that attempt's id and state, since the upstream may act twice if it
// ignores the Idempotency-Previous-* headers. guarded says fibermw guards the request. Keys
// and headers are never logged.
func logRequest(c *fiber.Ctx, log *slog.Logger, guarded bool) error {
	start := time.Now()
	if err := c.Next(); err != nil {
		if err := c.App().Config().ErrorHandler(c, err); err != nil {
			_ = c.SendStatus(fiber.StatusInternalServerError)
		}
	}
	path := string(c.Request().URI().PathOriginal())
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	if len(path) > 256 {
		path = path[:256] + "…"
	}
	status := c.Response().StatusCode()
	attrs := []slog.Attr{slog.String("method", c.Method()), slog.String("path", strings.ToValidUTF8(path, "\uFFFD")),
		slog.Int("status", status), slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000)}
	level := slog.LevelInfo
	switch info, ok := fibermw.FromContext(c); {
	case ok:
		attrs = append(attrs, slog.String("idempotency", "admitted"), slog.String("operation_id", info.OperationID),
			slog.Int64("fencing_token", info.FencingToken))
		if prev := info.PreviousOperation; prev != nil {
			level = slog.LevelWarn
			attrs = append(attrs, slog.String("previous_operation", prev.ID), slog.String("previous_state", prev.State))
		}
	case string(c.Response().Header.Peek(fibermw.HeaderReplayed)) == "true":
		attrs = append(attrs, slog.String("idempotency", "replayed"))
	case guarded && strings.HasPrefix(string(c.Response().Header.ContentType()), "application/problem+json") &&
		!c.Response().IsBodyStream(): // fibermw's or the proxy's own answer: it forwarded nothing
		var p struct {
			Code string `json:"code"`
		}
		if json.Unmarshal(c.Response().Body(), &p) == nil && p.Code != "" {
			attrs = append(attrs, slog.String("idempotency", p.Code))
		}
	}
	log.LogAttrs(c.UserContext(), level, "request", attrs...)
	return nil
}

// readGuarded reads the body of a request fibermw may guard, whole and at most
// MaxRequestBytes, before fibermw fingerprints it: a larger one is refused with 413
// request_invalid before anything is asked or forwarded, whether its length was declared or it
// came chunked.
func readGuarded(c *fiber.Ctx) error {
	req := c.Request()
	if !req.IsBodyStream() {
		return c.Next()
	}
	tooLarge := func() error {
		c.Context().SetConnectionClose() // the rest of the body is not read
		return fibermw.WriteProblem(c, &fibermw.Problem{Type: "about:blank", Title: "Request Entity Too Large",
			Status: fiber.StatusRequestEntityTooLarge, Code: CodeRequestInvalid,
			Detail: fmt.Sprintf("The request body is over %d bytes, so it was not forwarded.", MaxRequestBytes)})
	}
	if req.Header.ContentLength() > MaxRequestBytes {
		return tooLarge()
	}
	body, err := io.ReadAll(io.LimitReader(req.BodyStream(), MaxRequestBytes+1))
	switch {
	case err != nil:
		c.Context().SetConnectionClose()
		return fibermw.WriteProblem(c, &fibermw.Problem{Type: "about:blank", Title: "Bad Request",
			Status: fiber.StatusBadRequest, Code: CodeRequestInvalid,
			Detail: "The request body could not be read, so it was not forwarded."})
	case len(body) > MaxRequestBytes:
		return tooLarge()
	}
	req.SetBodyRaw(body)
	return c.Next()
}

type handler struct {
	upstream *url.URL
	noEffect map[int]bool
	timeout  time.Duration
	// client forwards guarded requests, passClient pass-through ones (see forward).
	client, passClient *http.Client
}

// MaxRequestBytes and MaxResponseBytes bound the bodies of guarded requests, which the proxy
// reads whole (docs/reference.md §12 "Limits"). A larger request is refused with 413 before
// anything is forwarded; a larger response is answered 502 upstream_answer_lost and left
// uncertain, since the upstream acted. Pass-through requests and answers are streamed, unbounded.
const (
	MaxRequestBytes  = 16 << 20
	MaxResponseBytes = 32 << 20
)

// forward sends the request to the upstream and leaves its response on c for fibermw to
// record. A request that never left (the upstream refused the connection, or the dial timed
// out) is no effect: 502 upstream_unreachable, key released. One that left and got no whole
// answer is 502 upstream_answer_lost, uncertain. A 5xx listed in Config.NoEffect5xx is no
// effect. Nothing of an admitted request's answer is written to c until all of it has arrived,
// so a lost answer never mixes the upstream's headers into the proxy's problem. A request
// fibermw did not admit (pass-through) is streamed both ways instead: its body as it arrives,
// its answer as it comes, bounded by UpstreamTimeout only until the answer's headers.
func (h *handler) forward(c *fiber.Ctx) error {
	_, admitted := fibermw.FromContext(c)
	target := *h.upstream
	target.Path = strings.TrimSuffix(h.upstream.Path, "/") + requestPath(c)
	target.RawPath = ""
	target.RawQuery = string(c.Request().URI().QueryString())
	ctx, cancel := context.WithCancel(context.Background())
	// A guarded request is bounded from sending to its whole answer. A pass-through one is
	// bounded only while waiting for the answer's headers once all of it is sent (passClient's
	// ResponseHeaderTimeout): its upload and its answer may take as long as they take.
	hc, deadline := h.passClient, (*time.Timer)(nil)
	if admitted {
		hc, deadline = h.client, time.AfterFunc(h.timeout, cancel)
	}
	streaming := false
	defer func() {
		if !streaming { // else the answer's body closes it when fasthttp has sent it all
			if deadline != nil {
				deadline.Stop()
			}
			cancel()
		}
	}()
	var body io.Reader
	var length int64
	if c.Request().IsBodyStream() {
		// Pass-through (readGuarded read a guarded one whole): forwarded as it arrives. Never
		// c.Request().Body() here: it reads the whole stream into memory, and turns a body cut
		// off midway into one whose text is the read error. A read error now aborts the
		// upstream request instead.
		body, length = c.Request().BodyStream(), int64(c.Request().Header.ContentLength())
		if length < 0 {
			length = -1 // chunked: sent chunked
		}
		if length == 0 {
			body = http.NoBody
		}
	} else {
		b := c.Request().Body()
		body, length = bytes.NewReader(b), int64(len(b))
	}
	req, err := http.NewRequestWithContext(ctx, c.Method(), target.String(), body)
	if err != nil {
		fibermw.NoEffect(c)
		return fibermw.WriteProblem(c, &fibermw.Problem{Type: "about:blank", Title: "Bad Request",
			Status: fiber.StatusBadRequest, Code: CodeRequestInvalid, Detail: "The request's path cannot be forwarded."})
	}
	req.ContentLength = length
	// net/http resends a request whose connection failed when it has a body it can rewind and
	// an Idempotency-Key: never here, where a resend is a second effect.
	req.GetBody = nil
	copyRequestHeaders(c, req)
	resp, err := hc.Do(req)
	if err != nil {
		if !admitted && !forward.NotSent(err) {
			return fibermw.WriteProblem(c, &fibermw.Problem{Type: "about:blank", Title: "Bad Gateway",
				Status: fiber.StatusBadGateway, Code: CodeUpstreamAnswerLost,
				Detail: "The request (not guarded: it carried no key) was sent, or cut off while sent, and no answer came."})
		}
		if forward.NotSent(err) {
			fibermw.NoEffect(c)
			return fibermw.WriteProblem(c, &fibermw.Problem{Type: "about:blank", Title: "Bad Gateway",
				Status: fiber.StatusBadGateway, Code: CodeUpstreamUnreachable,
				Detail: "The upstream could not be reached; the request was not sent. Retry with the same key."})
		}
		return answerLost(c)
	}
	if !admitted {
		// The headers are in: a pass-through answer may take as long as it lasts (server-sent
		// events, a download), and goes to the client as it comes.
		streaming = true
		forward.CopyResponseHeaders(c, resp)
		forward.StreamBody(c, resp, cancel)
		return nil
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
	if err != nil || len(answer) > MaxResponseBytes {
		return answerLost(c)
	}
	forward.CopyResponseHeaders(c, resp)
	c.Response().SetBodyRaw(answer)
	if h.noEffect[resp.StatusCode] {
		fibermw.NoEffect(c)
	}
	return nil
}

func answerLost(c *fiber.Ctx) error {
	return fibermw.WriteProblem(c, &fibermw.Problem{Type: "about:blank", Title: "Bad Gateway",
		Status: fiber.StatusBadGateway, Code: CodeUpstreamAnswerLost,
		Detail: "The request was sent but its answer was lost; the upstream may have acted. Its outcome is unknown until reconciled."})
}

// copyRequestHeaders passes the client's request headers to the upstream, but for hop-by-hop
// ones and the proxy's own Idempotency-* admission headers in any spelling (passAdmission sets
// those), and adds X-Forwarded-For, -Host and -Proto.
func copyRequestHeaders(c *fiber.Ctx, req *http.Request) {
	c.Request().Header.VisitAll(func(k, v []byte) {
		name := string(k)
		if forward.HopByHop(name) || admissionHeader(name) || strings.EqualFold(name, "Host") ||
			strings.EqualFold(name, "Content-Length") {
			return
		}
		// Under a non-canonical map key, so that net/http does not take the request for a
		// replayable one (see forward); HTTP header names are case-insensitive on the wire.
		if strings.EqualFold(name, "Idempotency-Key") || strings.EqualFold(name, "X-Idempotency-Key") {
			req.Header[strings.ToLower(name)] = append(req.Header[strings.ToLower(name)], string(v))
			return
		}
		req.Header.Add(name, string(v))
	})
	req.Header.Set("X-Forwarded-For", c.IP())
	req.Header.Set("X-Forwarded-Host", c.Hostname())
	req.Header.Set("X-Forwarded-Proto", c.Protocol())
	passAdmission(c, req.Header)
}

// admissionHeader reports whether name is one of the proxy's Idempotency-* admission headers,
// also spelled with underscores (some servers, CGI and WSGI among them, read "_" as "-").
func admissionHeader(name string) bool {
	n := strings.ReplaceAll(name, "_", "-")
	for _, h := range admissionHeaders {
		if strings.EqualFold(n, h) {
			return true
		}
	}
	return false
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
	// newest earlier generation that may have had its effect (uncertain, or succeeded and
	// admitted again after its TTL; docs/reference.md §4): check the destination before
	// acting again.
	HeaderPreviousOperation = "Idempotency-Previous-Operation"
	HeaderPreviousState     = "Idempotency-Previous-State"
	HeaderPreviousReceipt   = "Idempotency-Previous-Receipt"
)

var admissionHeaders = []string{HeaderOperation, HeaderFencingToken, HeaderPreviousOperation, HeaderPreviousState,
	HeaderPreviousReceipt}

// passAdmission tells the upstream what idemgate decided: the warning of a previous attempt
// that did not end cleanly must reach the code that performs the effect, or the proxy would
// lose it (fibermw hands it to Go handlers as Info.PreviousOperation).
func passAdmission(c *fiber.Ctx, h http.Header) {
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
