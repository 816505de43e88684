// Package mcpgateway is `idemgate mcp-gateway`: a gateway in front of any Model Context
// Protocol server (streamable HTTP transport) that never lets a retried tool call repeat its
// effect. docs/reference.md §13 "idemgate mcp-gateway" is its contract.
//
// It works on the JSON-RPC messages the client POSTs. A tools/call of a tool not marked
// readOnlyHint that carries an idempotency key (params._meta["io.idemgate/key"], a configured
// argument of that tool, or the idempotencyKey argument the gateway adds to the tool's input
// schema in tools/list) is admitted through an idemgate server first:
//   - the first call is forwarded once, and its CallToolResult recorded as the operation's
//     outcome; a repeat gets that result again, with _meta["io.idemgate/replayed"]: true;
//   - a repeat while the first runs waits for it (Config.Wait) and replays, or gets a tool
//     error with code request_in_progress;
//   - a call forwarded whose answer was lost (a reset, a timeout, a stream that ended without
//     the response, a 5xx) leaves the operation uncertain, and it and every repeat get a tool
//     error with code outcome_uncertain ("outcome unknown: verify before retrying"), never a
//     second forward, until the operation is reconciled or its TTL ends;
//   - the gateway's own tool errors carry {code, message, operation_id} in
//     _meta["io.idemgate/error"] (MetaError), and as structuredContent for tools without an
//     output schema;
//   - the same key on another tool or other arguments gets a tool error with code
//     fingerprint_mismatch.
//
// Everything else (other methods, read-only tools, calls without a key, GET and DELETE of the
// session) passes through unchanged, but tools/list answers, whose guarded tools gain the
// optional idempotencyKey input.
package mcpgateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/google/uuid"
	"github.com/idemgate/idemgate/web/client"
	"github.com/idemgate/idemgate/web/client/fibermw"
	"github.com/idemgate/idemgate/web/internal/forward"
)

// Names the gateway reads and writes in tool calls (docs/reference.md §13).
const (
	// MetaKey is the params._meta member that carries a call's idempotency key.
	MetaKey = "io.idemgate/key"
	// MetaReplayed is set to true in the _meta of a result replayed from the first call.
	MetaReplayed = "io.idemgate/replayed"
	// MetaOperation, MetaFencingToken and MetaPrevious are added to an admitted call's
	// params._meta for the upstream: the idemgate operation id, its fencing token, and, when
	// an earlier call with the key may have had its effect (docs/reference.md §4
	// previous_operation), {"id", "state", "receipt"} of that call: check before acting.
	MetaOperation    = "io.idemgate/operation_id"
	MetaFencingToken = "io.idemgate/fencing_token"
	MetaPrevious     = "io.idemgate/previous_operation"
	// KeyArgument is the optional input the gateway adds to guarded tools in tools/list, and
	// removes from the arguments before forwarding.
	KeyArgument = "idempotencyKey"
)

// Codes of the gateway's tool errors (structuredContent.code), idemgate's where they mean the
// same.
const (
	CodeOutcomeUncertain    = client.CodeOutcomeUncertain
	CodeRequestInProgress   = "request_in_progress"
	CodeFingerprintMismatch = client.CodeFingerprintMismatch
	CodeKeyMissing          = "idempotency_key_missing"
	CodeKeyInvalid          = "idempotency_key_invalid"
	CodeStoreUnavailable    = client.CodeStoreUnavailable
	CodeUpstreamUnreachable = "upstream_unreachable"
	CodeResultUnavailable   = "result_unavailable"
	CodeOperationFailed     = "operation_failed"
)

// leaseMargin is how much longer than UpstreamTimeout a guarded call's lease is: the time to
// record its outcome, retries included (record).
const leaseMargin = 30 * time.Second

// MaxMessageBytes bounds a POSTed JSON-RPC message and a guarded call's answer, which the
// gateway reads whole.
const MaxMessageBytes = 4 << 20

// Config configures a gateway. Upstream and Client are required.
type Config struct {
	// Upstream is the MCP server's endpoint URL, e.g. http://127.0.0.1:3000/mcp.
	Upstream string
	// Client talks to idemgate; its API key decides the tenant.
	Client *client.Client
	// Path is where the gateway serves the endpoint. Default "/mcp".
	Path string
	// KeyArguments names, per tool, an argument of its own that carries the idempotency key
	// (e.g. {"send_email": "request_id"}); it is forwarded as is, but left out of the
	// fingerprint.
	KeyArguments map[string]string
	// RequireKey answers a guarded tool's call without a key with a tool error
	// (idempotency_key_missing) instead of forwarding it unguarded.
	RequireKey bool
	// CallerHeader, when set (e.g. "Authorization"), scopes keys by the SHA-256 of that
	// request header's value as well, so two callers' equal keys are two keys and one caller
	// never gets another's result replayed.
	CallerHeader string
	// ReplayToolErrors records a result with isError: true as the call's outcome, replayed to
	// repeats, like any result. By default such a result (arguments the tool refused, an
	// unknown tool: SDKs answer those as tool errors, not JSON-RPC errors) releases the key,
	// so the corrected or repeated call runs: a tool that reports an error is taken at its
	// word that it did not act.
	ReplayToolErrors bool
	// TTL is how long a key is held (whole seconds). Default 24 h. It must exceed
	// UpstreamTimeout.
	TTL time.Duration
	// Wait is how long a repeat waits for a first call still running before it gets
	// request_in_progress. Default 30 s; negative: no wait.
	Wait time.Duration
	// UpstreamTimeout bounds one guarded call at the upstream, from sending to its answer.
	// Default 60 s. A call that hits it is uncertain.
	UpstreamTimeout time.Duration
	// Logger receives one line per guarded call and idemgate failures. Default slog.Default().
	Logger *slog.Logger
}

// New returns the gateway as a Fiber app. Errors: an Upstream that is not an absolute
// http(s) URL, a nil Client, a TTL that is not whole seconds or not longer than
// UpstreamTimeout.
func New(cfg Config) (*fiber.App, error) {
	u, err := forward.ParseUpstream(cfg.Upstream)
	if err != nil {
		return nil, err
	}
	if cfg.Client == nil {
		return nil, errors.New("mcp-gateway: no idemgate client")
	}
	if cfg.Path == "" {
		cfg.Path = "/mcp"
	}
	if cfg.TTL == 0 {
		cfg.TTL = 24 * time.Hour
	}
	if cfg.Wait == 0 {
		cfg.Wait = 30 * time.Second
	}
	if cfg.UpstreamTimeout <= 0 {
		cfg.UpstreamTimeout = 60 * time.Second
	}
	if cfg.TTL%time.Second != 0 || cfg.TTL <= cfg.UpstreamTimeout {
		return nil, fmt.Errorf("ttl %s: want whole seconds, more than the upstream timeout (%s)", cfg.TTL, cfg.UpstreamTimeout)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	newClient := func(headerTimeout time.Duration) *http.Client {
		return &http.Client{
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
			Transport: &http.Transport{Proxy: nil, DisableCompression: true, MaxIdleConnsPerHost: 256,
				IdleConnTimeout: 90 * time.Second, DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
				ResponseHeaderTimeout: headerTimeout},
		}
	}
	// Guarded exchanges are bounded by their context; pass-through ones wait at most
	// UpstreamTimeout for the answer's headers, then stream for as long as the answer lasts.
	g := &gateway{cfg: cfg, upstream: u, tools: map[string]toolInfo{}, http: newClient(0),
		passHTTP: newClient(cfg.UpstreamTimeout)}
	app := fiber.New(fiber.Config{DisableStartupMessage: true, BodyLimit: MaxMessageBytes,
		ReadTimeout: cfg.UpstreamTimeout, IdleTimeout: 90 * time.Second,
		ErrorHandler: func(c *fiber.Ctx, err error) error {
			status := fiber.StatusBadRequest
			var fe *fiber.Error
			if errors.As(err, &fe) {
				status = fe.Code
			}
			return c.Status(status).JSON(rpcError(nil, -32600, "The request could not be read: "+http.StatusText(status)))
		}})
	app.All(cfg.Path, g.handle)
	return app, nil
}

type gateway struct {
	cfg      Config
	upstream *url.URL
	// http is for the exchanges the gateway reads, passHTTP for pass-through.
	http, passHTTP *http.Client

	mu    sync.Mutex
	tools map[string]toolInfo // by tool name, from the last tools/list seen
}

// toolInfo is what the gateway knows of an upstream tool.
type toolInfo struct {
	readOnly bool
	// declaresKey: its input schema has its own idempotencyKey, which is then forwarded.
	declaresKey bool
	// outputSchema: it declares one, so a structuredContent of the gateway's own errors would
	// not match it (clients validate it even when isError is set: the TypeScript SDK does).
	outputSchema bool
}

// unreadable refuses a POST body that is not a JSON-RPC message the gateway can read.
func (g *gateway) unreadable(c *fiber.Ctx) error {
	return c.Status(fiber.StatusBadRequest).JSON(rpcError(nil, -32700,
		"Parse error: the body is not a JSON-RPC message the idempotency gateway can read, so it was not forwarded."))
}

// decodeMessage reads a JSON-RPC message with its member names matched exactly, as the
// upstream (JavaScript, say) reads them: encoding/json matches struct fields without regard to
// case, so {"method": "ping", "METHOD": "tools/call"} would be a tools/call here and a ping
// there, or the other way round.
func decodeMessage(raw []byte) (message, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		return message{}, false
	}
	msg := message{ID: m["id"], Params: m["params"], Result: m["result"], Error: m["error"]}
	if v, ok := m["method"]; ok && json.Unmarshal(v, &msg.Method) != nil {
		return message{}, false
	}
	if string(msg.ID) == "null" {
		msg.ID = nil
	}
	return msg, true
}

// message is a JSON-RPC 2.0 message as POSTed by the client.
type message struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  json.RawMessage `json:"params,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   json.RawMessage `json:"error,omitempty"`
}

func (g *gateway) handle(c *fiber.Ctx) error {
	if c.Method() != fiber.MethodPost {
		return g.passThrough(c, nil)
	}
	// The body as sent: never c.Body(), which inflates a Content-Encoding without a bound.
	// MCP messages are small JSON; a compressed one is refused, as idemgate's /mcp does.
	if ce := c.Request().Header.Peek(fiber.HeaderContentEncoding); len(ce) > 0 && !strings.EqualFold(string(ce), "identity") {
		return c.Status(fiber.StatusUnsupportedMediaType).JSON(rpcError(nil, -32600,
			"A compressed request body is not accepted; send the JSON-RPC message uncompressed."))
	}
	body := c.Request().Body()
	// A UTF-8 byte order mark, which JavaScript's JSON readers skip and Go's refuses.
	trimmed := bytes.TrimSpace(bytes.TrimPrefix(bytes.TrimSpace(body), []byte("\xEF\xBB\xBF")))
	if len(trimmed) > 0 && trimmed[0] == '[' {
		// A batch (MCP before 2025-06-18): each call in it would pass unguarded, so one that
		// holds a tools/call is refused; others pass.
		var batch []json.RawMessage
		if json.Unmarshal(trimmed, &batch) != nil {
			return g.unreadable(c)
		}
		for _, raw := range batch {
			if m, ok := decodeMessage(raw); !ok || m.Method == "tools/call" {
				return c.Status(fiber.StatusBadRequest).JSON(rpcError(nil, -32600,
					"A batch that holds tools/call (or a member the gateway cannot read) is not accepted by the "+
						"idempotency gateway; send each call alone."))
			}
		}
		return g.passThrough(c, body)
	}
	msg, ok := decodeMessage(trimmed)
	if !ok {
		// Never passed on: what the gateway cannot read, it cannot guard, and the upstream may
		// read it (a nesting deeper than Go's 10,000 levels, say).
		return g.unreadable(c)
	}
	if len(msg.ID) == 0 {
		return g.passThrough(c, body) // notifications, and responses to the server's requests
	}
	switch msg.Method {
	case "tools/list":
		return g.toolsList(c, body, msg)
	case "tools/call":
		return g.toolsCall(c, body, msg)
	}
	return g.passThrough(c, body)
}

// send forwards body (nil: the request's own, streamed) to the upstream with the client's
// headers (the session id, protocol version, Accept, Authorization) but hop-by-hop ones.
func (g *gateway) send(ctx context.Context, c *fiber.Ctx, body []byte) (*http.Response, error) {
	return g.sendAs(ctx, c, body, false)
}

// sendAs is send; read says the gateway reads the answer itself, so the client's
// Accept-Encoding is not passed on: an answer compressed for the client could not be read,
// and a call that ran would be taken for one whose answer was lost.
func (g *gateway) sendAs(ctx context.Context, c *fiber.Ctx, body []byte, read bool) (*http.Response, error) {
	var r io.Reader = http.NoBody
	if body != nil {
		r = bytes.NewReader(body)
	}
	target := *g.upstream
	if q := c.Request().URI().QueryString(); len(q) > 0 {
		target.RawQuery = string(q)
	}
	req, err := http.NewRequestWithContext(ctx, c.Method(), target.String(), r)
	if err != nil {
		return nil, err
	}
	req.GetBody = nil // never resent by net/http: a resend is a second effect
	c.Request().Header.VisitAll(func(k, v []byte) {
		if name := string(k); forward.HopByHop(name) || strings.EqualFold(name, "Host") || strings.EqualFold(name, "Content-Length") ||
			(read && strings.EqualFold(name, "Accept-Encoding")) {
			return
		}
		req.Header.Add(string(k), string(v))
	})
	if read {
		return g.http.Do(req)
	}
	return g.passHTTP.Do(req)
}

// passThrough forwards the request (body, or the request's own when nil) and streams the
// answer back unchanged: the session's GET stream, DELETE, notifications, read-only tools,
// calls without a key.
func (g *gateway) passThrough(c *fiber.Ctx, body []byte) error {
	if body == nil && c.Method() != fiber.MethodGet && c.Method() != fiber.MethodDelete {
		body = c.Request().Body()
	}
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := g.send(ctx, c, body)
	if err != nil {
		cancel()
		return c.Status(fiber.StatusBadGateway).JSON(rpcError(nil, -32603, "The MCP server could not be reached."))
	}
	forward.CopyResponseHeaders(c, resp)
	forward.StreamBody(c, resp, cancel)
	return nil
}

// exchange sends one JSON-RPC request to the upstream and returns its response message (from
// a JSON answer or an SSE stream, whichever the upstream chose), the HTTP answer's status and
// headers, and whether the request may have been processed when no response came (sent).
func (g *gateway) exchange(ctx context.Context, c *fiber.Ctx, msg message) (resp *message, hdr *http.Response, sent bool, err error) {
	// The upstream gets an id of the gateway's own, and the response the caller's: an
	// upstream may write the caller's id back in another form (1.0 as 1, "\u0061" as "a"),
	// and a response not recognised as the call's is an answer lost.
	callerID, id, body, err := withOwnID(msg)
	if err != nil {
		return nil, nil, false, err
	}
	defer func() {
		if resp != nil {
			resp.ID = callerID
		}
	}()
	r, err := g.sendAs(ctx, c, body, true)
	if err == nil && r.StatusCode >= 200 && r.StatusCode <= 299 && isEventStream(r) {
		defer r.Body.Close()
		m, err := readSSEResponse(io.LimitReader(r.Body, MaxMessageBytes+1), id, nil)
		if err != nil {
			err = lostAnswer(ctx, "the stream ended without the call's response", err)
		}
		return m, r, true, err
	}
	return g.readAnswer(ctx, keepBody(r), err, id)
}

// keptBody is an answer's body read into memory (at most MaxMessageBytes + 1 bytes), with the
// error that ended the reading, if any.
type keptBody struct {
	*bytes.Reader
	b   []byte
	err error
}

func (*keptBody) Close() error { return nil }

// keepBody reads r's body into memory and closes it; r may be nil (nothing was answered).
func keepBody(r *http.Response) *http.Response {
	if r == nil {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, MaxMessageBytes+1))
	r.Body.Close()
	r.Body = &keptBody{Reader: bytes.NewReader(b), b: b, err: err}
	return r
}

// withOwnID is msg as the upstream gets it, under an id of the gateway's own (see exchange).
func withOwnID(msg message) (callerID, id json.RawMessage, body []byte, err error) {
	callerID = msg.ID
	id, _ = json.Marshal("idemgate-" + uuid.NewString())
	msg.ID, msg.JSONRPC = id, "2.0"
	body, err = json.Marshal(msg)
	return callerID, id, body, err
}

// readSSEResponse reads server-sent events until the JSON-RPC response whose id is id. Every
// other event (a notification, a request of the server's to the client) is handed whole to
// onEvent, when not nil, as it arrives: lines as sent, ending with the blank line.
func readSSEResponse(r io.Reader, id json.RawMessage, onEvent func(event []byte)) (*message, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), MaxMessageBytes)
	var data, event bytes.Buffer
	for {
		more := sc.Scan()
		line := sc.Text()
		if !more || line == "" {
			if data.Len() > 0 {
				var m message
				if json.Unmarshal(data.Bytes(), &m) == nil && (m.Result != nil || m.Error != nil) &&
					bytes.Equal(bytes.TrimSpace(m.ID), bytes.TrimSpace(id)) {
					return &m, nil
				}
			}
			if event.Len() > 0 && onEvent != nil {
				event.WriteByte('\n')
				onEvent(event.Bytes())
			}
			data.Reset()
			event.Reset()
			if !more {
				if err := sc.Err(); err != nil {
					return nil, err
				}
				return nil, errors.New("the stream ended without the call's response")
			}
			continue
		}
		event.WriteString(line)
		event.WriteByte('\n')
		if v, ok := strings.CutPrefix(line, "data:"); ok {
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.WriteString(strings.TrimPrefix(v, " "))
		}
	}
}

// lostAnswer names why no answer came: the upstream timeout, or what went wrong reading.
func lostAnswer(ctx context.Context, what string, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errors.New("no answer within the upstream timeout")
	}
	if err != nil && err.Error() != what {
		return fmt.Errorf("%s: %w", what, err)
	}
	return errors.New(what)
}

// toolsList forwards tools/list and rewrites its answer: each tool not marked readOnlyHint
// gains the optional idempotencyKey input (unless it has a key argument of its own), and its
// description says what the key does. What it learns of the tools is kept for tools/call.
func (g *gateway) toolsList(c *fiber.Ctx, body []byte, msg message) error {
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.UpstreamTimeout)
	defer cancel()
	resp, hdr, _, err := g.exchange(ctx, c, msg)
	switch {
	case resp != nil && resp.Result == nil:
		return g.writeMessage(c, hdr, resp) // the upstream's JSON-RPC error
	case err != nil && hdr != nil && hdr.StatusCode >= 400:
		return g.writeRefusal(c, hdr)
	case err != nil:
		return c.Status(fiber.StatusBadGateway).JSON(rpcError(msg.ID, -32603, "The MCP server could not be reached."))
	}
	rewritten, err := g.rewriteTools(resp.Result)
	if err == nil {
		resp.Result = rewritten
	}
	return g.writeMessage(c, hdr, resp)
}

// keyDescription is added to the description of every guarded tool.
const keyDescription = " Idempotent through idemgate: pass a unique idempotencyKey (or _meta[\"io.idemgate/key\"]) " +
	"per intended action, and the same key when retrying it. A retry then returns the first call's result " +
	"(marked _meta[\"io.idemgate/replayed\"]) instead of acting again; if the first call's outcome is " +
	"unknown, the retry gets an error saying so (code outcome_uncertain): verify before acting with a new key."

func (g *gateway) rewriteTools(result json.RawMessage) (json.RawMessage, error) {
	var res map[string]json.RawMessage
	if err := json.Unmarshal(result, &res); err != nil {
		return nil, err
	}
	var tools []map[string]json.RawMessage
	if err := json.Unmarshal(res["tools"], &tools); err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	listed := map[string]toolInfo{}
	for _, t := range tools {
		var name string
		_ = json.Unmarshal(t["name"], &name)
		var ann struct {
			ReadOnly bool `json:"readOnlyHint"`
		}
		_ = json.Unmarshal(t["annotations"], &ann)
		var schema map[string]json.RawMessage
		_ = json.Unmarshal(t["inputSchema"], &schema)
		var props map[string]json.RawMessage
		_ = json.Unmarshal(schema["properties"], &props)
		_, declares := props[KeyArgument]
		_, hasOutput := t["outputSchema"]
		info := toolInfo{readOnly: ann.ReadOnly, declaresKey: declares, outputSchema: hasOutput}
		if prev, seen := listed[name]; seen {
			// Listed twice: read-only only if every entry says so (when unsure, guard).
			info.readOnly = info.readOnly && prev.readOnly
			info.declaresKey = info.declaresKey && prev.declaresKey
			info.outputSchema = info.outputSchema || prev.outputSchema
		}
		listed[name] = info
		g.tools[name] = info
		if ann.ReadOnly {
			continue
		}
		var desc string
		_ = json.Unmarshal(t["description"], &desc)
		if arg, own := g.cfg.KeyArguments[name]; own {
			t["description"], _ = json.Marshal(strings.TrimSpace(desc + strings.ReplaceAll(keyDescription,
				"a unique idempotencyKey", "a unique "+arg)))
			continue
		}
		t["description"], _ = json.Marshal(strings.TrimSpace(desc + keyDescription))
		if declares || schema == nil {
			continue
		}
		if props == nil {
			props = map[string]json.RawMessage{}
		}
		props[KeyArgument], _ = json.Marshal(map[string]any{"type": "string", "minLength": 1,
			"maxLength":   MaxKeyBytes, // bytes; ASCII keys are safe
			"description": "Idempotency key of this action (idemgate): a new one per action, the same one on retries."})
		schema["properties"], _ = json.Marshal(props)
		t["inputSchema"], _ = json.Marshal(schema)
	}
	res["tools"], _ = json.Marshal(tools)
	return json.Marshal(res)
}

// tool returns what is known of the upstream tool name, asking the upstream's tools/list
// (with the client's session headers) when it has not been seen yet. An unknown tool is
// guarded: guarding a read-only one costs a little, not guarding a writing one costs an
// effect.
func (g *gateway) tool(c *fiber.Ctx, name string) toolInfo {
	g.mu.Lock()
	t, ok := g.tools[name]
	g.mu.Unlock()
	if ok {
		return t
	}
	var cursor string
	for page := 0; page < 20; page++ {
		params := map[string]any{}
		if cursor != "" {
			params["cursor"] = cursor
		}
		raw, _ := json.Marshal(params)
		ctx, cancel := context.WithTimeout(context.Background(), g.cfg.UpstreamTimeout)
		resp, _, _, err := g.exchange(ctx, c, message{Method: "tools/list", Params: raw})
		cancel()
		if err != nil || resp.Result == nil {
			break
		}
		if _, err := g.rewriteTools(resp.Result); err != nil {
			break
		}
		var next struct {
			NextCursor string `json:"nextCursor"`
		}
		_ = json.Unmarshal(resp.Result, &next)
		if cursor = next.NextCursor; cursor == "" {
			break
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tools[name]
}

// callParams are a tools/call's params: the parts the gateway reads, and the rest as sent.
type callParams struct {
	Name      string
	Arguments map[string]json.RawMessage
	Meta      map[string]json.RawMessage
	rest      map[string]json.RawMessage
}

// decodeCallParams reads params with member names matched exactly (see decodeMessage).
func decodeCallParams(raw json.RawMessage) (callParams, bool) {
	var p callParams
	if json.Unmarshal(raw, &p.rest) != nil || p.rest == nil || json.Unmarshal(p.rest["name"], &p.Name) != nil || p.Name == "" {
		return p, false
	}
	if a, ok := p.rest["arguments"]; ok && string(a) != "null" && json.Unmarshal(a, &p.Arguments) != nil {
		return p, false
	}
	if m, ok := p.rest["_meta"]; ok && string(m) != "null" && json.Unmarshal(m, &p.Meta) != nil {
		return p, false
	}
	return p, true
}

// encode is the params to forward: as received, with the arguments and _meta as they are now.
func (p *callParams) encode() json.RawMessage {
	out := make(map[string]json.RawMessage, len(p.rest)+2)
	for k, v := range p.rest {
		out[k] = v
	}
	if p.Arguments != nil {
		out["arguments"], _ = json.Marshal(p.Arguments)
	}
	if p.Meta != nil {
		out["_meta"], _ = json.Marshal(p.Meta)
	}
	raw, _ := json.Marshal(out)
	return raw
}

func (g *gateway) toolsCall(c *fiber.Ctx, body []byte, msg message) error {
	p, ok := decodeCallParams(msg.Params)
	if !ok {
		return g.passThrough(c, body) // the upstream answers malformed calls
	}
	if stripOwnMeta(p.Meta, MetaKey) {
		// The io.idemgate/* members are the gateway's to set (operation id, fencing token, the
		// warning): a client's own never reach the upstream, guarded or not.
		msg.JSONRPC, msg.Params = "2.0", p.encode()
		body, _ = json.Marshal(msg)
	}
	t := g.tool(c, p.Name)
	log := g.cfg.Logger.With("tool", p.Name)
	if t.readOnly {
		return g.passThrough(c, body)
	}
	key, keyArg, found, err := g.key(&p, t)
	switch {
	case err != nil:
		return g.refuse(c, log, msg.ID, t, CodeKeyInvalid, err.Error(), "")
	case !found && g.cfg.RequireKey:
		return g.refuse(c, log, msg.ID, t, CodeKeyMissing,
			"This tool call needs an idempotency key: pass idempotencyKey (or _meta[\"io.idemgate/key\"]), a new one per action.", "")
	case !found:
		return g.passThrough(c, body)
	}
	scope := "mcp"
	if g.cfg.CallerHeader != "" {
		scope += forward.CallerScope(c.Get(g.cfg.CallerHeader))
	}
	// The lease outlives the longest forward by a margin: a call whose outcome could not be
	// recorded (idemgate down at that moment) lapses to uncertain after it, and shows in the
	// reconciliation queue, instead of answering request_in_progress for the whole TTL.
	lease := min(g.cfg.UpstreamTimeout+leaseMargin, g.cfg.TTL).Truncate(time.Second)
	req := client.AcquireRequest{Key: scope + "|" + key, TTL: g.cfg.TTL, Lease: lease, Fingerprint: fingerprint(p.Name, p.Arguments, keyArg),
		Operation: operationName(p.Name), Metadata: map[string]string{"tool": p.Name}}
	ctx := context.Background()
	waitUntil := time.Now().Add(max(g.cfg.Wait, 0))
	for {
		res, err := g.cfg.Client.Acquire(ctx, req)
		switch {
		case errors.Is(err, client.ErrFingerprintMismatch):
			return g.refuse(c, log, msg.ID, t, CodeFingerprintMismatch,
				"This idempotency key was used for another tool call (another tool or other arguments); use a new key for a new action.", "")
		case errors.Is(err, client.ErrOutcomeUncertain):
			var pr *client.Problem
			opID := ""
			if errors.As(err, &pr) && pr.Operation != nil {
				opID = pr.Operation.ID
			}
			return g.refuse(c, log, msg.ID, t, CodeOutcomeUncertain, unknownOutcomeText, opID)
		case errors.Is(err, client.ErrInvalidRequest):
			return g.refuse(c, log, msg.ID, t, CodeKeyInvalid, "The idempotency key is not usable: "+err.Error(), "")
		case err != nil:
			log.Warn("idemgate cannot be asked; the call was not forwarded", "err", err)
			return g.refuse(c, log, msg.ID, t, CodeStoreUnavailable,
				"The idempotency service cannot be reached, so the call was not forwarded. Retry later with the same key.", "")
		case res.Duplicate != nil:
			op, again := g.await(ctx, res.Duplicate, waitUntil)
			if again {
				req.AttemptID = ""
				continue
			}
			return g.duplicate(c, log, msg.ID, t, op)
		}
		return g.admitted(c, msg, p, t, res.Admitted)
	}
}

// MaxKeyBytes bounds a key given to the gateway: idemgate's 255 bytes less the scope the
// gateway puts before it ("mcp caller=<16 hex digits>|", 28 bytes).
const MaxKeyBytes = client.MaxKeyBytes - 32

// key finds the call's idempotency key: _meta["io.idemgate/key"], else the tool's key argument
// (the one configured for it, or idempotencyKey: the input the gateway added, removed here so
// the upstream gets the call it declared, or one the tool declares itself, forwarded). It also
// returns the name of the key argument, which the fingerprint leaves out ("" when none).
func (g *gateway) key(p *callParams, t toolInfo) (key, keyArg string, found bool, err error) {
	take := func(raw json.RawMessage, where string) (string, bool, error) {
		var s string
		// CanonicalJSON refuses a lone surrogate escape or invalid UTF-8, which json.Unmarshal
		// would turn into U+FFFD: "\ud800" and "\udc00" would be one key here, two in the client.
		_, canonErr := fibermw.CanonicalJSON(raw)
		if err := json.Unmarshal(raw, &s); err != nil || canonErr != nil || s == "" || len(s) > MaxKeyBytes {
			return "", false, fmt.Errorf("the idempotency key in %s must be a string of 1 to %d bytes", where, MaxKeyBytes)
		}
		return s, true, nil
	}
	if raw, ok := p.Meta[MetaKey]; ok {
		key, found, err = take(raw, `_meta["`+MetaKey+`"]`)
	}
	keyArg = KeyArgument
	if arg, ok := g.cfg.KeyArguments[p.Name]; ok {
		keyArg = arg
	}
	raw, ok := p.Arguments[keyArg]
	if !ok {
		return key, "", found, err
	}
	if keyArg == KeyArgument && !t.declaresKey {
		delete(p.Arguments, KeyArgument)
	}
	if !found && err == nil {
		key, found, err = take(raw, "the argument "+keyArg)
	}
	return key, keyArg, found, err
}

// fingerprint identifies a call: the tool's name and its arguments in canonical JSON
// (fibermw.CanonicalJSON: member order and white space do not matter, numbers compare
// exactly), without the key argument keyArg.
func fingerprint(name string, args map[string]json.RawMessage, keyArg string) string {
	if _, ok := args[keyArg]; ok {
		args = maps.Clone(args)
		delete(args, keyArg)
	}
	raw, _ := json.Marshal(args)
	if canon, err := fibermw.CanonicalJSON(raw); err == nil {
		raw = canon
	}
	h := sha256.New()
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write(raw)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// operationName is the tool's name as an idemgate operation name when it is one, else "".
func operationName(tool string) string {
	if client.ValidOperationName(tool) {
		return tool
	}
	return ""
}

// await waits, until waitUntil, for the holder op to end; again reports the key may be free
// (released, or its hold ended without an outcome): acquire again.
func (g *gateway) await(ctx context.Context, op *client.Operation, waitUntil time.Time) (_ *client.Operation, again bool) {
	for op.State == client.StateInProgress || op.State == client.StateReleased {
		if op.State == client.StateReleased || !op.Held {
			return op, time.Now().Before(waitUntil)
		}
		left := time.Until(waitUntil)
		if left <= 0 {
			return op, false
		}
		asked := time.Now()
		d, err := g.cfg.Client.WaitOperation(ctx, op.ID, left)
		if err != nil {
			return op, false
		}
		op = &d.Operation
		if op.State == client.StateInProgress && time.Since(asked) < 100*time.Millisecond {
			time.Sleep(100*time.Millisecond - time.Since(asked)) // a server without long polls: no busy loop
		}
	}
	return op, false
}

// duplicate answers a repeat of a call whose first one holds or held the key.
func (g *gateway) duplicate(c *fiber.Ctx, log *slog.Logger, id json.RawMessage, t toolInfo, op *client.Operation) error {
	switch {
	case op.State == client.StateUncertain:
		return g.refuse(c, log, id, t, CodeOutcomeUncertain, unknownOutcomeText, op.ID)
	case op.State == client.StateInProgress:
		return g.refuse(c, log, id, t, CodeRequestInProgress,
			"The first call with this idempotency key is still running; retry later with the same key.", op.ID)
	case op.State == client.StateFailed:
		// Reconciled failed by an operator (a failure the gateway saw released the key): the
		// key stays held until the operator releases it or the TTL ends.
		return g.refuse(c, log, id, t, CodeOperationFailed,
			"The first call with this idempotency key was found not to have taken effect (reconciled failed), "+
				"but its key is still held: use a new key to act, or ask an operator to release this one.", op.ID)
	case op.Outcome == nil || len(op.Outcome.Response) == 0 || string(op.Outcome.Response) == "null":
		return g.refuse(c, log, id, t, CodeResultUnavailable,
			"The first call with this idempotency key took effect ("+op.State+"), but its result was not kept "+
				"(over 64 KiB, or confirmed by an operator after its answer was lost): do not act again.", op.ID)
	}
	var result map[string]json.RawMessage
	if err := json.Unmarshal(op.Outcome.Response, &result); err != nil {
		return g.refuse(c, log, id, t, CodeResultUnavailable, "The first call's stored result is not a tool result.", op.ID)
	}
	var meta map[string]json.RawMessage
	_ = json.Unmarshal(result["_meta"], &meta)
	if meta == nil {
		meta = map[string]json.RawMessage{}
	}
	meta[MetaReplayed] = json.RawMessage("true")
	result["_meta"], _ = json.Marshal(meta)
	raw, _ := json.Marshal(result)
	log.Info("tool call", "decision", "replayed", "operation_id", op.ID, "fencing_token", op.FencingToken)
	return g.writeMessage(c, nil, &message{JSONRPC: "2.0", ID: id, Result: raw})
}

// admitted forwards an admitted call once and records what came back (docs/reference.md §13):
// a result is the outcome, replayed to repeats; a JSON-RPC error or a 4xx means the tool did
// not run (the key is released); anything else after the call left is uncertain.
func (g *gateway) admitted(c *fiber.Ctx, msg message, p callParams, t toolInfo, adm *client.Admission) error {
	if p.Meta == nil {
		p.Meta = map[string]json.RawMessage{}
	}
	p.Meta[MetaOperation], _ = json.Marshal(adm.OperationID)
	p.Meta[MetaFencingToken], _ = json.Marshal(adm.FencingToken)
	if prev := adm.PreviousOperation; prev != nil {
		warn := map[string]any{"id": prev.ID, "state": prev.State}
		if prev.Outcome != nil && prev.Outcome.Receipt != "" {
			warn["receipt"] = prev.Outcome.Receipt
		}
		p.Meta[MetaPrevious], _ = json.Marshal(warn)
	}
	msg.Params = p.encode()
	start := time.Now()
	log := g.cfg.Logger.With("tool", p.Name, "operation_id", adm.OperationID, "fencing_token", adm.FencingToken)
	if adm.PreviousOperation != nil {
		log = log.With("previous_operation", adm.PreviousOperation.ID, "previous_state", adm.PreviousOperation.State)
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.cfg.UpstreamTimeout)
	callerID, id, body, err := withOwnID(msg)
	if err != nil {
		cancel()
		return err
	}
	r, err := g.sendAs(ctx, c, body, true)
	if err == nil && r.StatusCode >= 200 && r.StatusCode <= 299 && isEventStream(r) {
		return g.streamCall(c, ctx, cancel, r, id, callerID, t, adm, log, start)
	}
	resp, hdr, sent, err := g.readAnswer(ctx, keepBody(r), err, id)
	cancel()
	if resp != nil {
		resp.ID = callerID
	}
	out, refusal := g.settle(adm, t, log.With("duration_ms", time.Since(start).Milliseconds()), callerID, resp, hdr, sent, err)
	if refusal != nil {
		return g.writeRefusal(c, refusal)
	}
	return g.writeMessage(c, hdr, out)
}

// isEventStream reports whether r's body is server-sent events.
func isEventStream(r *http.Response) bool {
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return mt == "text/event-stream"
}

// streamCall passes an admitted call's event stream on to the client as it comes (so a tool
// can ask the client something mid-call: elicitation, sampling), and settles the call when its
// response arrives: that event is the settled answer, under the caller's id. A client that
// goes away does not stop the reading: the outcome is still recorded.
func (g *gateway) streamCall(c *fiber.Ctx, ctx context.Context, cancel context.CancelFunc, r *http.Response,
	id, callerID json.RawMessage, t toolInfo, adm *client.Admission, log *slog.Logger, start time.Time) error {
	c.Status(fiber.StatusOK)
	c.Set(fiber.HeaderContentType, "text/event-stream")
	c.Set(fiber.HeaderCacheControl, "no-cache")
	if sid := r.Header.Get("Mcp-Session-Id"); sid != "" {
		c.Set("Mcp-Session-Id", sid)
	}
	c.Context().SetBodyStreamWriter(func(w *bufio.Writer) {
		defer cancel()
		defer r.Body.Close()
		gone := false
		write := func(b []byte) {
			if gone {
				return
			}
			if _, err := w.Write(b); err != nil || w.Flush() != nil {
				gone = true
			}
		}
		resp, err := readSSEResponse(io.LimitReader(r.Body, MaxMessageBytes+1), id, write)
		if err != nil {
			err = lostAnswer(ctx, "the stream ended without the call's response", err)
		}
		if resp != nil {
			resp.ID = callerID
		}
		out, _ := g.settle(adm, t, log.With("duration_ms", time.Since(start).Milliseconds()), callerID, resp, r, true, err)
		out.JSONRPC = "2.0"
		raw, _ := json.Marshal(out)
		write([]byte("event: message\ndata: " + string(raw) + "\n\n"))
	})
	return nil
}

// readAnswer is exchange's reading of the upstream's answer r to the request with id (or of
// the error sendErr of sending it).
func (g *gateway) readAnswer(ctx context.Context, r *http.Response, sendErr error, id json.RawMessage) (resp *message, hdr *http.Response, sent bool, err error) {
	if sendErr != nil {
		if forward.NotSent(sendErr) {
			return nil, nil, false, sendErr
		}
		return nil, nil, true, lostAnswer(ctx, "the connection failed", sendErr)
	}
	if r.StatusCode < 200 || r.StatusCode > 299 {
		// Kept for writeRefusal: a 4xx (a lost session, say) is passed on as it came (keepBody
		// read it into memory).
		return nil, r, r.StatusCode < 400 || r.StatusCode >= 500, fmt.Errorf("upstream answered %d", r.StatusCode)
	}
	raw := r.Body.(*keptBody).b
	if len(raw) > MaxMessageBytes || r.Body.(*keptBody).err != nil {
		return nil, r, true, lostAnswer(ctx, "the answer was cut or is over the limit", r.Body.(*keptBody).err)
	}
	var m message
	if err := json.Unmarshal(raw, &m); err != nil || !bytes.Equal(bytes.TrimSpace(m.ID), bytes.TrimSpace(id)) {
		return nil, r, true, errors.New("the answer is not the call's JSON-RPC response")
	}
	return &m, r, true, nil
}

// settle records what the upstream's answer to an admitted call means (docs/reference.md §13)
// and returns what the caller gets: out, or refusal, an upstream 4xx to pass on as it came.
func (g *gateway) settle(adm *client.Admission, t toolInfo, log *slog.Logger, callerID json.RawMessage,
	resp *message, hdr *http.Response, sent bool, err error) (out *message, refusal *http.Response) {
	switch {
	case err != nil && !sent:
		g.record(adm, client.StatusFailed, nil, "not forwarded: "+err.Error())
		if hdr != nil { // a 4xx: the upstream refused the request (a lost session, say); the client handles it
			log.Info("tool call", "decision", "refused by the upstream", "status", hdr.StatusCode)
			return nil, hdr
		}
		log.Warn("tool call", "decision", "upstream unreachable", "err", err)
		return toolErrorMessage(callerID, t, CodeUpstreamUnreachable,
			"The MCP server could not be reached; the call was not sent. Retry with the same key.", adm.OperationID), nil
	case err != nil:
		g.record(adm, client.StatusUncertain, nil, "answer lost: "+err.Error())
		log.Warn("tool call", "decision", "answer lost: uncertain", "err", err)
		return toolErrorMessage(callerID, t, CodeOutcomeUncertain, unknownOutcomeText, adm.OperationID), nil
	case resp.Error != nil:
		g.record(adm, client.StatusFailed, nil, "the upstream answered a JSON-RPC error")
		log.Info("tool call", "decision", "JSON-RPC error: released")
		return resp, nil
	case !g.cfg.ReplayToolErrors && isToolError(resp.Result):
		g.record(adm, client.StatusFailed, nil, "the tool answered an error (isError)")
		log.Info("tool call", "decision", "tool error: released")
		return resp, nil
	}
	resp.Result = withoutOwnMeta(resp.Result)
	g.record(adm, client.StatusSucceeded, resp.Result, "")
	level := slog.LevelInfo
	if adm.PreviousOperation != nil {
		level = slog.LevelWarn
	}
	log.Log(context.Background(), level, "tool call", "decision", "forwarded")
	return resp, nil
}

// stripOwnMeta removes from meta the io.idemgate/* members but keep, and reports whether it
// removed any.
func stripOwnMeta(meta map[string]json.RawMessage, keep string) bool {
	removed := false
	for k := range meta {
		if strings.HasPrefix(k, "io.idemgate/") && k != keep {
			delete(meta, k)
			removed = true
		}
	}
	return removed
}

// withoutOwnMeta is result without the io.idemgate/* members an upstream put in its _meta,
// so that a first call's result never claims to be a replay.
func withoutOwnMeta(result json.RawMessage) json.RawMessage {
	var r map[string]json.RawMessage
	if json.Unmarshal(result, &r) != nil {
		return result
	}
	var meta map[string]json.RawMessage
	if json.Unmarshal(r["_meta"], &meta) != nil || !stripOwnMeta(meta, "") {
		return result
	}
	r["_meta"], _ = json.Marshal(meta)
	out, err := json.Marshal(r)
	if err != nil {
		return result
	}
	return out
}

// isToolError reports whether a tools/call result says isError: true.
func isToolError(result json.RawMessage) bool {
	var r struct {
		IsError bool `json:"isError"`
	}
	return json.Unmarshal(result, &r) == nil && r.IsError
}

// record writes an admitted call's outcome, retrying a short idemgate outage (an outcome not
// recorded leaves the key in progress until its TTL). A result over idemgate's 64 KiB limit is
// recorded without it: repeats then get result_unavailable, never a second run.
func (g *gateway) record(adm *client.Admission, status string, result json.RawMessage, note string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if len(note) > 900 {
		note = note[:900]
	}
	req := client.OutcomeRequest{OwnerToken: adm.OwnerToken, Status: status, Note: note, Release: status == client.StatusFailed}
	if result != nil {
		req.Response = result
	}
	_, err := g.cfg.Client.RecordOutcome(ctx, adm.OperationID, req)
	for wait := 250 * time.Millisecond; client.Temporary(err) && ctx.Err() == nil; wait = min(2*wait, 2*time.Second) {
		select {
		case <-ctx.Done():
		case <-time.After(wait):
			_, err = g.cfg.Client.RecordOutcome(ctx, adm.OperationID, req)
		}
	}
	if errors.Is(err, client.ErrPayloadTooLarge) {
		req.Response = nil
		_, err = g.cfg.Client.RecordOutcome(ctx, adm.OperationID, req)
	}
	if err != nil && !(status == client.StatusUncertain && errors.Is(err, client.ErrInvalidTransition)) {
		g.cfg.Logger.Error("idemgate: could not record the tool call's outcome; its key stays in progress until the TTL",
			"operation_id", adm.OperationID, "status", status, "err", err)
	}
}

// writeMessage answers with one JSON-RPC message as application/json, keeping the upstream's
// session id header when there was an upstream answer.
func (g *gateway) writeMessage(c *fiber.Ctx, hdr *http.Response, m *message) error {
	m.JSONRPC = "2.0"
	if hdr != nil {
		if sid := hdr.Header.Get("Mcp-Session-Id"); sid != "" {
			c.Set("Mcp-Session-Id", sid)
		}
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return err
	}
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Status(fiber.StatusOK).Send(raw)
}

// writeRefusal passes on an upstream's refusal of the call (4xx) with its status and headers.
func (g *gateway) writeRefusal(c *fiber.Ctx, hdr *http.Response) error {
	forward.CopyResponseHeaders(c, hdr)
	b, _ := io.ReadAll(hdr.Body) // exchange kept it in memory
	return c.Send(b)
}

// MetaError is the _meta member of the gateway's own tool errors: {code, message,
// operation_id?}, for programs; the message is also the text content, for models.
const MetaError = "io.idemgate/error"

// toolError answers a call to tool t with a tool error (isError: true): the message as text
// content, {code, message, operation_id?} in _meta["io.idemgate/error"], and the same as
// structuredContent unless t declares an output schema, which it would not match (the
// TypeScript SDK's client validates structuredContent against it even on errors, and turns a
// mismatch into a protocol error that hides the code).
func (g *gateway) toolError(c *fiber.Ctx, id json.RawMessage, t toolInfo, code, text, operationID string) error {
	return g.writeMessage(c, nil, toolErrorMessage(id, t, code, text, operationID))
}

// toolErrorMessage is the JSON-RPC response of toolError.
func toolErrorMessage(id json.RawMessage, t toolInfo, code, text, operationID string) *message {
	detail := map[string]any{"code": code, "message": text}
	if operationID != "" {
		detail["operation_id"] = operationID
	}
	res := map[string]any{
		"content": []map[string]string{{"type": "text", "text": text}},
		"_meta":   map[string]any{MetaError: detail},
		"isError": true,
	}
	if !t.outputSchema {
		res["structuredContent"] = detail
	}
	result, _ := json.Marshal(res)
	return &message{JSONRPC: "2.0", ID: id, Result: result}
}

// unknownOutcomeText is the message of outcome_uncertain.
const unknownOutcomeText = "Outcome unknown: verify before retrying. A call with this idempotency key was sent to the " +
	"tool, but its answer was lost, so it may have taken effect. It is not sent again with this key; check whether " +
	"the action happened before acting with a new key."

// refuse answers a guarded call with the gateway's tool error code, and logs the decision.
func (g *gateway) refuse(c *fiber.Ctx, log *slog.Logger, id json.RawMessage, t toolInfo, code, text, operationID string) error {
	log.Info("tool call", "decision", code, "operation_id", operationID)
	return g.toolError(c, id, t, code, text, operationID)
}

// rpcError is a JSON-RPC error response.
func rpcError(id json.RawMessage, code int, text string) map[string]any {
	if id == nil {
		id = json.RawMessage("null")
	}
	return map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": code, "message": text}}
}
