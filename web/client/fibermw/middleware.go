package fibermw

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/utils"
	"github.com/idemgate/idemgate/web/client"
)

// HeaderIdempotencyKey is the request header of the IETF draft; HeaderReplayed marks a
// replayed response.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderReplayed       = "Idempotent-Replayed"
)

// Defaults of Config's zero fields.
const (
	DefaultTTL          = 24 * time.Hour
	DefaultRetryAfter   = time.Second
	DefaultWriteTimeout = 10 * time.Second
)

// DefaultReplayHeaders are the response headers stored and replayed by default: those that
// describe the body or the created resource. Set-Cookie and anything per-request (Date,
// X-Request-ID) are left out on purpose.
var DefaultReplayHeaders = []string{
	fiber.HeaderContentType, fiber.HeaderContentEncoding, fiber.HeaderContentLanguage,
	fiber.HeaderContentLocation, fiber.HeaderLocation, fiber.HeaderETag, fiber.HeaderLastModified,
	fiber.HeaderCacheControl, fiber.HeaderLink, fiber.HeaderVary,
}

// Config configures New. Only Client is required.
type Config struct {
	// Client is the idemgate client; its API key decides the idemgate tenant. Required.
	Client *client.Client

	// TTL is how long a key is held: retries within it are answered from the first request,
	// after it the key is admitted again. Whole seconds, from 1 s to idemgate's maximum (30
	// days by default). Default 24 h.
	TTL time.Duration

	// Methods are the methods guarded; others pass through untouched. Default POST and PATCH
	// (the draft's non-idempotent methods).
	Methods []string

	// Required reports whether a guarded request must carry Idempotency-Key; a request
	// without one is then refused with 400 (draft §2.7), else it runs unguarded. Default:
	// every guarded request requires one.
	Required func(c *fiber.Ctx) bool

	// Next skips the middleware for a request when it returns true.
	Next func(c *fiber.Ctx) bool

	// Header is the request header carrying the key, matched case-insensitively. Default
	// "Idempotency-Key".
	Header string

	// KeyPrefix is prepended to the scope of every key, e.g. the service's name, so several
	// services can share one idemgate tenant.
	KeyPrefix string

	// Scope returns the scope of a request's key: the same key in two scopes is two
	// independent keys. Default: method and route pattern ("POST /v1/orders/:id/charge"),
	// which is the route the middleware is mounted on; mounted with app.Use the pattern is
	// the Use prefix, so one key on two endpoints conflicts (422) rather than running twice.
	// The idemgate tenant (the client's API key) always scopes too. If your service has users
	// of its own, return the user's id here so users cannot collide.
	Scope func(c *fiber.Ctx) string

	// FingerprintHeaders are request headers that take part in the fingerprint. Default
	// Authorization, so one key replayed with another caller's credentials is refused (422)
	// instead of answered with the first caller's response. Set it to an empty non-nil
	// slice to fingerprint no header.
	FingerprintHeaders []string

	// Fingerprint, if set, replaces the default fingerprint (SHA-256 of method, path, sorted
	// query, media type, FingerprintHeaders and the RFC 8785-canonical JSON or raw body, as
	// sent: Content-Encoding is not decoded). At
	// most 256 characters.
	Fingerprint func(c *fiber.Ctx) string

	// Operation, if set, names the business operation of a request at idemgate (1–64 of
	// [A-Za-z0-9._:-]), for operators' filters. Default: none.
	Operation func(c *fiber.Ctx) string

	// ReplayHeaders are the response headers stored and replayed. Default
	// DefaultReplayHeaders.
	ReplayHeaders []string

	// NoEffectStatus reports statuses below 500 that mean the request was not processed, so
	// the key is released and a retry runs again. Default: 408, 425 and 429.
	NoEffectStatus func(status int) bool

	// Lease, if set, is how long a request's handler may run without a heartbeat before
	// idemgate presumes it crashed and its operation uncertain (docs/reference.md §8; whole
	// seconds, 1 s to TTL). The middleware renews it every Lease/3 while the handler runs, so a
	// long handler keeps its key, and a crashed service's key stops answering "in progress"
	// after Lease rather than after TTL. When a renew is refused the handler's UserContext is
	// cancelled (cause wrapping client.ErrLeaseLost). Default 0: the lease is the TTL and
	// nothing is renewed.
	Lease time.Duration

	// OnExpiry is idemgate's expiry policy of the keys: client.OnExpiryReadmit (default) or
	// client.OnExpiryHoldUntilReconciled (a key whose operation is uncertain is never admitted
	// again until an operator reconciles it, whatever the TTL).
	OnExpiry string

	// Wait, if positive, turns on wait-and-replay: a duplicate that arrives while the
	// original request runs waits up to Wait for its outcome (a long poll at idemgate, no
	// polling here) and then replays the original response, instead of answering 409
	// request_in_progress at once. If the original released the key (NoEffect), the duplicate
	// runs the handler itself; after Wait with no outcome it gets the 409. Default 0.
	Wait time.Duration

	// RetryAfter is sent with 409 request_in_progress. Default 1 s.
	RetryAfter time.Duration

	// WriteTimeout bounds recording the outcome at idemgate after the handler, retries
	// included. That write uses a context the request's cancellation cannot end. Default 10 s.
	WriteTimeout time.Duration

	// FailOpen runs the handler unguarded when idemgate cannot be asked at acquire. Default
	// false: such a request is refused with 503 and Retry-After and never runs unguarded.
	FailOpen bool

	// Respond writes the middleware's own answers. Default WriteProblem (problem+json).
	Respond func(c *fiber.Ctx, p *Problem) error

	// DocumentationURL, when set, is the page that documents the service's idempotency rules
	// (keys, expiry): every answer of the middleware itself links to it with
	// Link: <DocumentationURL>; rel="describedby", as the IETF draft asks of its 400 and 422
	// answers (draft-ietf-httpapi-idempotency-key-header-07 §2.7).
	DocumentationURL string

	// Logger receives failures to talk to idemgate. Default slog.Default().
	Logger *slog.Logger
}

type middleware struct {
	cfg     Config
	methods map[string]bool
	replay  []string
}

// New returns the middleware. It panics if cfg.Client is nil or cfg.TTL is not a whole
// number of seconds, as Fiber's middlewares do with unusable configuration.
//
// Per request it: (1) passes through methods outside Config.Methods; (2) reads and validates
// Idempotency-Key (ParseKey; missing → 400 idempotency_key_missing unless not Required, more
// than one or malformed → 400 idempotency_key_invalid); (3) acquires "<scope>|<key>" at
// idemgate with the request's fingerprint and Config.TTL; (4) on admission runs the handler
// and records its response as the outcome; on a duplicate replays the recorded response with
// Idempotent-Replayed: true, or answers 409 while the original runs (request_in_progress,
// Retry-After) or when its outcome is uncertain; on a fingerprint mismatch answers 422; when
// idemgate cannot be asked answers 503 (or runs unguarded with FailOpen).
//
// Outcomes: a response below 500 is recorded succeeded with the response (status, the
// ReplayHeaders, body), except NoEffectStatus ones; a 5xx response or a panic is recorded
// uncertain and the key stays blocked until reconciled or expired, because the handler may
// have had its effect; NoEffect(c) and NoEffectStatus record failed and release the key.
func New(cfg Config) fiber.Handler {
	if cfg.Client == nil {
		panic("fibermw: Config.Client is required")
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.TTL < time.Second || cfg.TTL%time.Second != 0 {
		panic(fmt.Sprintf("fibermw: Config.TTL %v must be a whole number of seconds, at least 1 s", cfg.TTL))
	}
	if cfg.Lease < 0 || cfg.Lease%time.Second != 0 || cfg.Lease > cfg.TTL {
		panic(fmt.Sprintf("fibermw: Config.Lease %v must be a whole number of seconds, at most Config.TTL", cfg.Lease))
	}
	if len(cfg.Methods) == 0 {
		cfg.Methods = []string{fiber.MethodPost, fiber.MethodPatch}
	}
	if cfg.Required == nil {
		cfg.Required = func(*fiber.Ctx) bool { return true }
	}
	if cfg.Header == "" {
		cfg.Header = HeaderIdempotencyKey
	}
	if cfg.Scope == nil {
		cfg.Scope = func(c *fiber.Ctx) string { return c.Method() + " " + c.Route().Path }
	}
	if cfg.FingerprintHeaders == nil {
		cfg.FingerprintHeaders = []string{fiber.HeaderAuthorization}
	}
	if cfg.ReplayHeaders == nil {
		cfg.ReplayHeaders = DefaultReplayHeaders
	}
	if cfg.NoEffectStatus == nil {
		cfg.NoEffectStatus = func(s int) bool {
			return s == fiber.StatusRequestTimeout || s == fiber.StatusTooEarly || s == fiber.StatusTooManyRequests
		}
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = DefaultRetryAfter
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.Respond == nil {
		cfg.Respond = WriteProblem
	}
	if doc := cfg.DocumentationURL; doc != "" {
		respond := cfg.Respond
		link := "<" + doc + `>; rel="describedby"`
		cfg.Respond = func(c *fiber.Ctx, p *Problem) error {
			c.Append(fiber.HeaderLink, link)
			return respond(c, p)
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := &middleware{cfg: cfg, methods: map[string]bool{}}
	for _, meth := range cfg.Methods {
		m.methods[strings.ToUpper(meth)] = true
	}
	for _, h := range cfg.ReplayHeaders {
		m.replay = append(m.replay, canonicalHeader(h))
	}
	return m.handle
}

func (m *middleware) handle(c *fiber.Ctx) error {
	if (m.cfg.Next != nil && m.cfg.Next(c)) || !m.methods[c.Method()] {
		return c.Next()
	}
	values := c.Request().Header.PeekAll(m.cfg.Header)
	switch {
	case len(values) == 0:
		if !m.cfg.Required(c) {
			return c.Next()
		}
		return m.cfg.Respond(c, newProblem(http.StatusBadRequest, CodeKeyMissing,
			"This request requires an "+m.cfg.Header+" header."))
	case len(values) > 1:
		return m.invalidKey(c, "must appear only once")
	}
	key, err := ParseKey(values[0])
	if err != nil {
		return m.invalidKey(c, strings.TrimPrefix(err.Error(), ErrInvalidKey.Error()+": "))
	}
	scoped := serverKey(m.cfg.KeyPrefix+m.cfg.Scope(c), key)
	req := client.AcquireRequest{Key: scoped, TTL: m.cfg.TTL, Fingerprint: m.fingerprint(c),
		CorrelationID: correlationID(c), Metadata: m.metadata(c)}
	if m.cfg.Operation != nil {
		req.Operation = m.cfg.Operation(c)
	}
	req.Lease, req.OnExpiry = m.cfg.Lease, m.cfg.OnExpiry
	var waitUntil time.Time
	if m.cfg.Wait > 0 {
		waitUntil = time.Now().Add(m.cfg.Wait)
	}
	for {
		res, err := m.cfg.Client.Acquire(c.UserContext(), req)
		switch {
		case errors.Is(err, client.ErrFingerprintMismatch):
			return m.cfg.Respond(c, newProblem(http.StatusUnprocessableEntity, CodeFingerprintMismatch,
				"This "+m.cfg.Header+" was used for a different request; use a new key for a new request."))
		case errors.Is(err, client.ErrOutcomeUncertain):
			// idemgate refuses the key (docs/reference.md §8): its operation's outcome is
			// unknown, and it must not run again until reconciled. A decision, not an outage.
			return m.uncertain(c)
		case err != nil:
			return m.unavailable(c, scoped, err)
		case res.Duplicate != nil:
			op, again := m.await(c, res.Duplicate, waitUntil)
			if again {
				req.AttemptID = ""
				continue
			}
			return m.duplicate(c, op)
		}
		adm := res.Admitted
		info := &Info{Key: key, ServerKey: scoped, OperationID: adm.OperationID, FencingToken: adm.FencingToken,
			ExpiresAt: adm.ExpiresAt, LeaseExpiresAt: adm.LeaseExpiresAt, PreviousOperation: adm.PreviousOperation,
			ownerToken: adm.OwnerToken}
		c.Locals(infoKey{}, info)
		return m.run(c, info, adm)
	}
}

// await waits, with wait-and-replay on, until the holder op has an outcome or waitUntil
// passes, and returns the operation as last seen. again reports that the key may be free
// now (the holder released it, or its hold ended without an outcome): acquire again. Without
// wait-and-replay, or when idemgate cannot be asked, it returns op as it is.
func (m *middleware) await(c *fiber.Ctx, op *client.Operation, waitUntil time.Time) (_ *client.Operation, again bool) {
	for op.State == client.StateInProgress || op.State == client.StateReleased {
		if op.State == client.StateReleased || !op.Held {
			return op, time.Now().Before(waitUntil)
		}
		left := time.Until(waitUntil)
		if waitUntil.IsZero() || left <= 0 {
			return op, false
		}
		asked := time.Now()
		d, err := m.cfg.Client.WaitOperation(c.UserContext(), op.ID, left)
		if err != nil {
			m.cfg.Logger.Warn("idemgate: waiting for the original request failed", "operation_id", op.ID, "err", err)
			return op, false
		}
		op = &d.Operation
		if op.State == client.StateInProgress && time.Since(asked) < minWaitRound {
			// Answered early (a server or proxy without long polls): never a busy loop.
			select {
			case <-time.After(minWaitRound - time.Since(asked)):
			case <-c.UserContext().Done():
				return op, false
			}
		}
	}
	return op, false
}

// minWaitRound is the shortest time between two long polls of one operation.
const minWaitRound = 100 * time.Millisecond

// uncertain answers a request whose key's operation has an unknown outcome.
func (m *middleware) uncertain(c *fiber.Ctx) error {
	return m.cfg.Respond(c, newProblem(http.StatusConflict, CodeOutcomeUncertain,
		"A request with this key ended without a known outcome; it will not run again until that is resolved."))
}

func (m *middleware) invalidKey(c *fiber.Ctx, msg string) error {
	p := newProblem(http.StatusBadRequest, CodeKeyInvalid, "The "+m.cfg.Header+" header is invalid.")
	p.Errors = []client.FieldError{{Field: m.cfg.Header, Message: msg}}
	return m.cfg.Respond(c, p)
}

// unavailable answers an acquire that failed for another reason than a conflict: idemgate is
// unreachable, overloaded or refuses the configuration. The handler does not run unguarded
// unless FailOpen.
func (m *middleware) unavailable(c *fiber.Ctx, scoped string, err error) error {
	if errors.Is(err, context.Canceled) {
		// The request's context ended (its client went away) before admission: nothing ran.
		m.cfg.Logger.Info("request cancelled before admission", "key", scoped, "err", err)
		p := newProblem(http.StatusServiceUnavailable, CodeUnavailable, "The request was cancelled before it could be admitted.")
		return m.cfg.Respond(c, p)
	}
	if m.cfg.FailOpen {
		m.cfg.Logger.Warn("idemgate unavailable; running the request unguarded (FailOpen)", "key", scoped, "err", err)
		return c.Next()
	}
	m.cfg.Logger.Error("idemgate unavailable; request refused", "key", scoped, "err", err)
	p := newProblem(http.StatusServiceUnavailable, CodeUnavailable,
		"The idempotency service cannot be reached; the request was not run. Retry with the same key.")
	p.RetryAfter = 2 * time.Second
	var pe *client.Problem
	if errors.As(err, &pe) && pe.RetryAfter > 0 {
		p.RetryAfter = pe.RetryAfter
	}
	return m.cfg.Respond(c, p)
}

// duplicate answers a request whose key is held by an earlier one.
func (m *middleware) duplicate(c *fiber.Ctx, op *client.Operation) error {
	switch {
	case op.State == client.StateInProgress:
		p := newProblem(http.StatusConflict, CodeInProgress,
			"A request with this key is still in progress; retry after it completes.")
		p.RetryAfter = m.cfg.RetryAfter
		return m.cfg.Respond(c, p)
	case op.State == client.StateUncertain:
		return m.uncertain(c)
	}
	var stored storedResponse
	var body []byte
	ok := false
	if op.Outcome != nil && op.State == client.StateSucceeded {
		stored, body, ok = decodeResponse(op.Outcome.Response)
	}
	// A 5xx is only ever stored with an uncertain outcome (New: "a 5xx response … is recorded
	// uncertain"). Found under a succeeded state, it is what the client got before an operator
	// reconciled the operation, not the response of the effect the operator confirmed: replayed,
	// it told the client "outcome unknown" with Idempotent-Replayed: true.
	reconciled := ok && stored.Status >= 500
	if !ok || stored.BodyOmitted || reconciled {
		detail := "A request with this key has ended, but its response cannot be replayed; use a new key for a new request."
		switch {
		case reconciled:
			detail = "An operator confirmed that the request with this key succeeded, but its response was never received; " +
				"it cannot be replayed. Do not run it again."
		case op.State == client.StateFailed:
			detail = "The request with this key was recorded failed without its key being released; use a new key, " +
				"or have an operator release this key so that it may run again."
		}
		p := newProblem(http.StatusConflict, CodeResponseUnavailable, detail)
		p.OriginalStatus = stored.Status
		if reconciled {
			p.OriginalStatus = 0
		}
		return m.cfg.Respond(c, p)
	}
	c.Status(stored.Status)
	for name, vals := range stored.Headers {
		c.Response().Header.Del(name)
		for _, v := range vals {
			c.Response().Header.Add(name, v)
		}
	}
	c.Set(HeaderReplayed, "true")
	c.Response().SetBodyRaw(body)
	return nil
}

// run calls the rest of the chain for an admitted request and records the outcome. With
// Config.Lease it heartbeats the lease while the chain runs, and the handler's UserContext is
// cancelled when the lease is lost.
func (m *middleware) run(c *fiber.Ctx, info *Info, adm *client.Admission) (err error) {
	stop := func() error { return nil }
	if m.cfg.Lease > 0 {
		parent := c.UserContext()
		var hctx context.Context
		hctx, stop = m.cfg.Client.Heartbeat(parent, adm.Lease())
		c.SetUserContext(hctx)
		defer c.SetUserContext(parent)
	}
	defer func() {
		if r := recover(); r != nil {
			_ = stop()
			m.record(c, info, client.StatusUncertain, false, nil, fmt.Sprintf("handler panicked: %v", r))
			panic(r)
		}
	}()
	chainErr := c.Next()
	if lost := stop(); lost != nil {
		m.cfg.Logger.Warn("idemgate: the lease was lost while the handler ran; its operation is uncertain",
			"key", info.ServerKey, "operation_id", info.OperationID, "err", lost)
	}
	if chainErr != nil {
		// Let the application's error handler write the response now, so that what is
		// recorded is what the client gets.
		if herr := c.App().ErrorHandler(c, chainErr); herr != nil {
			_ = c.Status(fiber.StatusInternalServerError).SendString(utils.StatusMessage(fiber.StatusInternalServerError))
		}
	}
	status := c.Response().StatusCode()
	resp := encodeResponse(status, m.replayHeaders(c, status), string(c.Response().Header.ContentType()), c.Response().Body())
	switch {
	case info.noEffect:
		m.record(c, info, client.StatusFailed, true, resp, "no effect (fibermw.NoEffect)")
	case status >= 500:
		m.record(c, info, client.StatusUncertain, false, resp, fmt.Sprintf("handler answered %d", status))
	case m.cfg.NoEffectStatus(status):
		m.record(c, info, client.StatusFailed, true, resp, fmt.Sprintf("handler answered %d (not processed)", status))
	default:
		m.record(c, info, client.StatusSucceeded, false, resp, "")
	}
	return nil
}

// record writes the outcome at idemgate with a context that outlives the request: a client
// that hangs up must not leave the operation without its outcome.
func (m *middleware) record(c *fiber.Ctx, info *Info, status string, release bool, resp []byte, note string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.UserContext()), m.cfg.WriteTimeout)
	defer cancel()
	req := client.OutcomeRequest{OwnerToken: info.ownerToken, Status: status, Receipt: info.receipt, Note: note,
		Release: release}
	if resp != nil {
		req.Response = json.RawMessage(resp)
	}
	_, err := m.cfg.Client.RecordOutcome(ctx, info.OperationID, req)
	// The client gives up after its RetryPolicy's few tries (about half a second); an outcome
	// not recorded leaves the key in progress until the TTL (24 h by default), every retry
	// answered 409. So a short idemgate outage (a restart, a failover) is waited out for the
	// whole WriteTimeout. An outcome write is owner-checked and the same one again changes
	// nothing, so calling again is safe.
	for wait := 250 * time.Millisecond; client.Temporary(err) && ctx.Err() == nil; wait = min(2*wait, 2*time.Second) {
		select {
		case <-ctx.Done():
		case <-time.After(wait):
			_, err = m.cfg.Client.RecordOutcome(ctx, info.OperationID, req)
		}
	}
	if errors.Is(err, client.ErrPayloadTooLarge) && resp != nil {
		// Not expected (encodeResponse stays under the limit), but an outcome without its
		// response beats none.
		req.Response = nil
		_, err = m.cfg.Client.RecordOutcome(ctx, info.OperationID, req)
	}
	if err != nil && status == client.StatusUncertain && errors.Is(err, client.ErrInvalidTransition) {
		// The lease lapsed first and idemgate already marked the operation uncertain
		// (docs/reference.md §8): uncertain → uncertain is no transition, and nothing is lost.
		return
	}
	if err != nil {
		m.cfg.Logger.Error("idemgate: could not record the outcome; the key stays in progress until its lease ends",
			"key", info.ServerKey, "operation_id", info.OperationID, "status", status, "err", err)
	}
}

// replayHeaders returns the allow-listed response headers. Content-Type is left out of
// responses that carry none on the wire (1xx, 204, 304), where fasthttp reports its default
// but does not send it.
func (m *middleware) replayHeaders(c *fiber.Ctx, status int) map[string][]string {
	var out map[string][]string
	noBody := status < 200 || status == fiber.StatusNoContent || status == fiber.StatusNotModified
	for _, name := range m.replay {
		if noBody && name == fiber.HeaderContentType {
			continue
		}
		for _, v := range c.Response().Header.PeekAll(name) {
			if out == nil {
				out = map[string][]string{}
			}
			out[name] = append(out[name], string(v))
		}
	}
	return out
}

func (m *middleware) fingerprint(c *fiber.Ctx) string {
	if m.cfg.Fingerprint != nil {
		return m.cfg.Fingerprint(c)
	}
	r := request{Method: c.Method(), Path: string(c.Request().URI().Path()),
		RawQuery: string(c.Request().URI().QueryString()), ContentType: string(c.Request().Header.ContentType()),
		Body: c.Request().Body()} // as sent: never decoded by Content-Encoding (TestFingerprintIsOfTheBodyAsSent)
	for _, h := range m.cfg.FingerprintHeaders {
		for _, v := range c.Request().Header.PeekAll(h) {
			r.Headers = append(r.Headers, [2]string{strings.ToLower(h), string(v)})
		}
	}
	return fingerprint(r)
}

// maxMetadataPath bounds the request path kept in the operation's metadata.
const maxMetadataPath = 1024

// metadata is stored with the operation for operators: what request the key guards.
func (m *middleware) metadata(c *fiber.Ctx) map[string]string {
	path := string(c.Request().URI().PathOriginal())
	if len(path) > maxMetadataPath {
		path = path[:maxMetadataPath]
	}
	return map[string]string{"method": c.Method(), "route": c.Route().Path,
		"path": strings.ToValidUTF8(path, "\uFFFD")}
}

// correlationID is the request's id (Fiber's requestid middleware, or an X-Request-ID
// header), so an operator can find the request in the service's logs.
func correlationID(c *fiber.Ctx) string {
	id, _ := c.Locals("requestid").(string)
	if id == "" {
		id = string(c.Request().Header.Peek(fiber.HeaderXRequestID))
	}
	if id == "" || !utf8.ValidString(id) || utf8.RuneCountInString(id) > client.MaxCorrelationIDChars ||
		strings.IndexByte(id, 0) >= 0 {
		return ""
	}
	return strings.Clone(id)
}
