package web

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/web/buildinfo"
	"github.com/idemgate/idemgate/web/client/fibermw"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The MCP endpoint (docs/reference.md §13 "The /mcp endpoint"): the JSON API's admission
// calls as Model Context Protocol tools, for AI agents that run side effects. It is served by
// the official Go SDK (streamable HTTP, stateless, application/json answers) through Fiber's
// net/http adaptor, behind the same API-key authentication as /v1, and every tool makes the
// same services call as its JSON API handler and answers the same DTOs (api_types.go).
//
// Three things of the SDK's typed tool path are not used, each for a fault it would bring:
//   - Arguments are decoded again from the raw request (decodeArguments), strictly, as the
//     JSON API decodes bodies. The SDK decodes them into a map[string]any first: numbers
//     become float64 (a stored result 9007199254740993 would come back ...992, and two
//     admits whose arguments differ in that digit would share a fingerprint), a lone
//     surrogate escape becomes U+FFFD (two different keys would be one) and a repeated
//     member silently wins.
//   - Output schemas are given, not inferred: inference maps json.RawMessage (metadata, a
//     stored result) to an array of bytes, and every schema must also admit the error shape
//     (mcpToolError), since clients validate an error's structuredContent against it too (the
//     reference TypeScript SDK does).
//   - Results are encoded by the handlers (mcpAnswer), not by the SDK, which would round-trip
//     them through map[string]any, floats included, to validate them.

// mcpPath is the route of the MCP endpoint.
const mcpPath = "/mcp"

// mcpCall is what a tool handler needs of the HTTP request that carries its call: the
// authenticated principal (apiAuth), the request's context with its store deadline, request
// id and trace span (for every services call, as c.UserContext() in the JSON API handlers),
// the request id for error results, and how to wait without the store deadline
// (waitContext, for status with wait_seconds).
type mcpCall struct {
	principal services.Principal
	ctx       context.Context
	requestID string
	wait      func() (context.Context, context.CancelFunc)
}

// mcpCallKey is the context key of the *mcpCall in the context of every tool handler.
type mcpCallKey struct{}

// handleMCP is POST /mcp, after apiAuth. The net/http request the adaptor makes has fasthttp's
// request context as its context, without the Fiber request's store deadline, request id or
// span; so each request gets a context of its own, built here, which carries the *mcpCall
// (principal included) to the tools: the SDK derives every tool handler's context from it
// (values only: its JSON-RPC layer drops the cancellation). That context has no deadline: in
// JSON mode the SDK waits under it for the tools' answers, and a status call may wait longer
// than the store timeout. The tools take the store deadline from mcpCall.ctx, and mcpCall.wait
// is called only while a tool runs, which is within this handler (the SDK answers a JSON-mode
// request once its tools have returned). The adaptor buffers the answer (its Flush does
// nothing), which JSONResponse makes one JSON document anyway.
func (s *Server) handleMCP() fiber.Handler {
	srv := s.newMCPServer()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
		Stateless:           true,
		JSONResponse:        true,
		Logger:              s.log,
		MaxRequestBodyBytes: services.MaxBodyBytes,
		// The SDK's DNS-rebinding check refuses a request that reached a loopback address with
		// another Host, which is every request through a reverse proxy on the same machine. It
		// protects servers that trust whoever can reach them; this one needs a bearer API key,
		// which a rebound page does not have (browsers never add one on their own).
		DisableLocalhostProtection: true,
	})
	return func(c *fiber.Ctx) error {
		call := &mcpCall{principal: principal(c), ctx: c.UserContext(), requestID: requestID(c),
			wait: func() (context.Context, context.CancelFunc) { return waitContext(c) }}
		base := context.WithValue(context.WithoutCancel(c.UserContext()), mcpCallKey{}, call)
		return adaptor.HTTPHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.ServeHTTP(w, r.WithContext(base))
		}))(c)
	}
}

// mcpChallenge adds the Bearer challenge to a refused API key on /mcp (RFC 6750 §3; the MCP
// authorization rules ask for it on every 401), as the error handler does on /v1.
func mcpChallenge(c *fiber.Ctx) error {
	err := c.Next()
	if errors.Is(err, services.ErrUnauthorized) {
		c.Set(fiber.HeaderWWWAuthenticate, `Bearer realm="idemgate"`)
	}
	return err
}

// Tool names of the MCP endpoint (docs/reference.md §13).
const (
	mcpToolAdmit         = "admit"
	mcpToolComplete      = "complete"
	mcpToolRelease       = "release"
	mcpToolRenew         = "renew"
	mcpToolStatus        = "status"
	mcpToolListUncertain = "list_uncertain"
)

// mcpInstructions is the server's instructions to clients: the guarantees every tool shares.
const mcpInstructions = `idemgate decides whether a side effect (a charge, an e-mail, an order) may run, so that
retries, timeouts and replays never run it twice. Before the effect call admit with a key naming the business
operation (e.g. "charge:order-5521", never a message or request id) and the request's fingerprint or arguments;
run the effect only when admitted is true, then call complete with the outcome. Keys are scoped to the tenant of
the API key. At most one admission per key at a time. When the holder times out or crashes without an outcome,
its operation becomes uncertain and the key is never silently admitted again to run the effect: a later
admission carries previous_operation, and the destination must be checked before acting again. Errors are tool
results with isError true and structuredContent {code, message}; the codes are those of docs/reference.md §4.`

// admitInput is the admit tool's arguments: POST /v1/acquire's members (docs/reference.md
// §4), with arguments as an alternative to fingerprint.
type admitInput struct {
	Key          *string         `json:"key" jsonschema:"the idempotency key: names the business operation (charge:order-5521), never a delivery or request id; 1-255 bytes of UTF-8, case-sensitive, scoped to the API key's tenant"`
	Operation    *string         `json:"operation,omitempty" jsonschema:"the operation's name (charge), 1-64 of A-Z a-z 0-9 . _ : -; the same key with another name is fingerprint_mismatch"`
	Fingerprint  *string         `json:"fingerprint,omitempty" jsonschema:"identifies the request's parameters (at most 256 characters, e.g. a hash): the same key with another fingerprint is fingerprint_mismatch, never a duplicate. Give this or arguments, not both"`
	Arguments    json.RawMessage `json:"arguments,omitempty" jsonschema:"the request's parameters as a JSON object, instead of fingerprint: the fingerprint is then sha256: and the hex SHA-256 of their canonical JSON (members sorted, no white space, numbers compared exactly). They are not stored"`
	TTLSeconds   *int64          `json:"ttl_seconds,omitempty" jsonschema:"how long the key is protected after admission, in whole seconds (1 to the server's maximum, 30 days by default); required unless a policy of the tenant gives one. Complete before it ends"`
	LeaseSeconds *int64          `json:"lease_seconds,omitempty" jsonschema:"how long the admitted attempt may run without an outcome or a renew before it is presumed crashed and made uncertain, in whole seconds from 1 to ttl_seconds; default the policy's, else ttl_seconds"`
	OnExpiry     *string         `json:"on_expiry,omitempty" jsonschema:"readmit (default): after the TTL the key may be admitted again, with previous_operation; hold_until_reconciled: an uncertain operation keeps the key until its outcome is recorded"`
	AttemptID    *string         `json:"attempt_id,omitempty" jsonschema:"this call's id (at most 128 characters), the same on its retries: repeating it after a lost answer gets the same admission back with a fresh owner token, while the operation is in progress. Repeat it only when the answer was lost"`
}

// completeInput is the complete tool's arguments: POST /v1/operations/{id}/outcome's members
// (docs/reference.md §4) without release, and result for response.
type completeInput struct {
	OperationID *string         `json:"operation_id" jsonschema:"the admitted operation's operation_id"`
	OwnerToken  *string         `json:"owner_token" jsonschema:"the owner_token admit returned; checked first, a wrong one is not_owner whatever else is wrong"`
	Status      *string         `json:"status,omitempty" jsonschema:"required: succeeded (the effect happened), failed (it did not happen and will not), or uncertain (you do not know whether it happened)"`
	Receipt     *string         `json:"receipt,omitempty" jsonschema:"the destination's reference for the effect (a charge id, an invoice number), at most 512 characters"`
	Result      json.RawMessage `json:"result,omitempty" jsonschema:"any JSON up to 64 KiB: stored as the outcome's response and returned to duplicates instead of running the effect again"`
	Note        *string         `json:"note,omitempty" jsonschema:"a note for people, at most 1000 characters"`
}

// releaseInput is the release tool's arguments: POST /v1/release's members.
type releaseInput struct {
	Key        *string `json:"key" jsonschema:"the key to give back"`
	OwnerToken *string `json:"owner_token" jsonschema:"the owner_token admit returned for the hold"`
	Reason     *string `json:"reason,omitempty" jsonschema:"why the effect did not run, at most 500 characters"`
}

// renewInput is the renew tool's arguments: POST /v1/operations/{id}/renew's members without
// extend_ttl (docs/reference.md §8).
type renewInput struct {
	OperationID  *string `json:"operation_id" jsonschema:"the admitted operation's operation_id"`
	OwnerToken   *string `json:"owner_token" jsonschema:"the owner_token admit returned; checked first"`
	LeaseSeconds *int64  `json:"lease_seconds,omitempty" jsonschema:"required: the new lease, in whole seconds from now (1 to the server's maximum TTL); it never goes past the operation's expires_at"`
}

// statusInput is the status tool's arguments: GET /v1/operations/{id}?wait= by operation_id,
// or the key's newest operation by key (GET /v1/keys/{key}).
type statusInput struct {
	Key         *string  `json:"key,omitempty" jsonschema:"the key whose newest operation to read; give this or operation_id"`
	OperationID *string  `json:"operation_id,omitempty" jsonschema:"the operation to read; give this or key"`
	WaitSeconds *float64 `json:"wait_seconds,omitempty" jsonschema:"wait up to this many seconds (0 to 60) for an in_progress operation to end (an outcome, a release or a lapsed lease), then answer with its state then"`
}

// listUncertainInput is the list_uncertain tool's arguments: GET
// /v1/operations?state=uncertain's query parameters (docs/reference.md §10).
type listUncertainInput struct {
	Limit  *int    `json:"limit,omitempty" jsonschema:"operations per page, 1 to 500 (default 50)"`
	Cursor *string `json:"cursor,omitempty" jsonschema:"the next_cursor of the previous page"`
}

// mcpToolError is the structuredContent of a refused tool call (isError true): the problem
// document of the JSON API (web/errors.go newProblem) in the words of a tool result.
type mcpToolError struct {
	Code      string         `json:"code" jsonschema:"stable and machine-readable: the problem codes of docs/reference.md §4 (invalid_request, fingerprint_mismatch, outcome_uncertain, not_owner, key_not_held, effect_confirmed, lease_expired, invalid_transition, not_found, payload_too_large, too_many_waiters, store_unavailable, internal)"`
	Message   string         `json:"message" jsonschema:"what went wrong, for people"`
	Errors    []problemField `json:"errors,omitempty" jsonschema:"invalid_request: every bad argument with what is wrong with it"`
	Operation *operationDTO  `json:"operation,omitempty" jsonschema:"outcome_uncertain from admit: the key's uncertain operation. Do not run the effect: check the destination, then record the real outcome"`
	// RetryAfterSeconds is set for store_unavailable and too_many_waiters (the JSON API's 503
	// with Retry-After): nothing is known to have happened, so the same call may be repeated.
	RetryAfterSeconds int    `json:"retry_after_seconds,omitempty" jsonschema:"store_unavailable, too_many_waiters: nothing is known to have happened; repeat the same call (admit with the same attempt_id) after this many seconds"`
	RequestID         string `json:"request_id,omitempty" jsonschema:"the HTTP request's id, to find it in the server's logs"`
}

// text is the error's text content: code, message and each field error.
func (e *mcpToolError) text() string {
	var b strings.Builder
	b.WriteString(e.Code + ": " + e.Message)
	for _, f := range e.Errors {
		b.WriteString(" " + f.Field + ": " + f.Message + ".")
	}
	return b.String()
}

// newMCPServer builds the MCP server with its six tools (docs/reference.md §13).
func (s *Server) newMCPServer() *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "idemgate", Title: "idemgate", Version: buildinfo.Read().Version},
		&mcp.ServerOptions{Instructions: mcpInstructions})
	srv.AddReceivingMiddleware(structureSDKErrors)
	yes, no := true, false

	addMCPTool(s, srv, &mcp.Tool{
		Name: mcpToolAdmit,
		Description: `Ask before running a side effect whether this attempt may run it. Keys are scoped to the API key's tenant. ` +
			`At most one admission per key at a time: of any number of concurrent calls exactly one gets admitted true. ` +
			`admitted true: run the effect now, then call complete with operation_id and owner_token before expires_at (the TTL; renew extends the lease). ` +
			`admitted false: a duplicate; do not run the effect: the operation says what the holder did (its outcome and stored result), or wait for it with status. ` +
			`Pass fingerprint or arguments (fingerprint = "sha256:" + hex SHA-256 of their canonical JSON): the same key with other parameters is fingerprint_mismatch, never a duplicate. ` +
			`A holder that times out or crashes without complete leaves its operation uncertain, and the key is never silently admitted again to run the effect: ` +
			`until the TTL ends admit answers outcome_uncertain with the operation; after it, a new admission carries previous_operation: check the destination before acting. ` +
			`Same answers as POST /v1/acquire (docs/reference.md §4).`,
		Annotations: &mcp.ToolAnnotations{
			Title: "Admit an effect",
			// Not idempotent: each call is logged as an attempt, an attempt_id retry replaces
			// the owner token, and after the TTL the same call admits a new operation.
			IdempotentHint:  false,
			DestructiveHint: &no, // it adds a hold and an operation; it changes no existing one
			OpenWorldHint:   &no,
		},
		InputSchema: mcpInputSchema[admitInput]([]string{"key"}, func(s *jsonschema.Schema) {
			s.Properties["arguments"].Type = "object"
			s.Properties["on_expiry"].Enum = []any{services.OnExpiryReadmit, services.OnExpiryHold}
			s.Properties["ttl_seconds"].Minimum = jsonschema.Ptr(1.0)
			s.Properties["lease_seconds"].Minimum = jsonschema.Ptr(1.0)
		}),
		OutputSchema: mcpOutputSchema(
			mcpDTOSchema[admittedResponse](map[string]string{
				"admitted":           "true: this attempt is admitted: run the effect now",
				"owner_token":        "secret proof of ownership for complete, release and renew; returned only here",
				"fencing_token":      "1, 2, 3… per key: pass it to destinations that can refuse writes of a stale attempt",
				"expires_at":         "the end of the TTL: complete before it",
				"lease_expires_at":   "the end of the lease: complete or renew before it, or the operation becomes uncertain",
				"previous_operation": "an earlier operation of the key that may have had its effect (it is uncertain, or it succeeded and its TTL is over): check the destination before acting",
			}),
			mcpDTOSchema[duplicateResponse](map[string]string{
				"admitted":  "false: a duplicate: do not run the effect",
				"operation": "the operation holding the key: its state, outcome and stored result",
			})),
	}, s.mcpAdmit)

	addMCPTool(s, srv, &mcp.Tool{
		Name: mcpToolComplete,
		Description: `Record the outcome of an admitted operation: succeeded (the effect happened; result is stored and returned to duplicates), ` +
			`failed (it did not happen), or uncertain (you do not know). Owner-checked: owner_token first (not_owner). ` +
			`Call it before the TTL ends (expires_at); after the TTL, or once the lease lapsed, the operation is uncertain, and a late complete reconciles it. ` +
			`Recording the same outcome again changes nothing; another outcome after a final one is invalid_transition. ` +
			`Same as POST /v1/operations/{id}/outcome (docs/reference.md §4); answers the operation.`,
		Annotations: &mcp.ToolAnnotations{
			Title: "Record the outcome",
			// The same outcome again is a no-op (docs/reference.md §3), so a retry after a lost
			// answer is safe.
			IdempotentHint:  true,
			DestructiveHint: &no, // it adds the outcome; a different second one is refused
			OpenWorldHint:   &no,
		},
		InputSchema: mcpInputSchema[completeInput]([]string{"operation_id", "owner_token"}, func(s *jsonschema.Schema) {
			s.Properties["status"].Enum = []any{services.StateSucceeded, services.StateFailed, services.StateUncertain}
		}),
		OutputSchema: mcpOutputSchema(mcpDTOSchema[operationDTO](nil)),
	}, s.mcpComplete)

	addMCPTool(s, srv, &mcp.Tool{
		Name: mcpToolRelease,
		Description: `Give the key back without an effect, when the effect did not happen and will not (e.g. it was refused before anything was sent). ` +
			`Owner-checked compare-and-delete of the hold: not_owner for another hold, effect_confirmed for a succeeded operation, ` +
			`outcome_uncertain for an uncertain one (reconcile first), key_not_held when the hold is gone (also for a repeat). The next admit of the key is admitted. ` +
			`Same as POST /v1/release (docs/reference.md §4).`,
		Annotations: &mcp.ToolAnnotations{
			Title: "Release the key",
			// A repeat finds the hold gone (key_not_held, or not_owner once another attempt
			// holds the key) and changes nothing.
			IdempotentHint: true,
			// It deletes the hold, letting another attempt run the effect.
			DestructiveHint: &yes,
			OpenWorldHint:   &no,
		},
		InputSchema:  mcpInputSchema[releaseInput]([]string{"key", "owner_token"}, nil),
		OutputSchema: mcpOutputSchema(mcpDTOSchema[releaseResponse](nil)),
	}, s.mcpRelease)

	addMCPTool(s, srv, &mcp.Tool{
		Name: mcpToolRenew,
		Description: `Heartbeat of a running admitted operation: its lease now ends lease_seconds from now, never past expires_at. ` +
			`Owner-checked (not_owner); lease_expired once the lease lapsed (the operation is uncertain and renewing cannot revive it); ` +
			`invalid_transition when it has an outcome or was released. Same as POST /v1/operations/{id}/renew (docs/reference.md §8).`,
		Annotations: &mcp.ToolAnnotations{
			Title: "Renew the lease",
			// It sets the lease end from now; it never adds up, so a repeat leaves the lease as
			// the last call set it.
			IdempotentHint:  true,
			DestructiveHint: &no,
			OpenWorldHint:   &no,
		},
		InputSchema: mcpInputSchema[renewInput]([]string{"operation_id", "owner_token"}, func(s *jsonschema.Schema) {
			s.Properties["lease_seconds"].Minimum = jsonschema.Ptr(1.0)
		}),
		OutputSchema: mcpOutputSchema(mcpDTOSchema[renewResponse](nil)),
	}, s.mcpRenew)

	addMCPTool(s, srv, &mcp.Tool{
		Name: mcpToolStatus,
		Description: `Read an operation of this tenant, by operation_id or as the newest operation of key: state (in_progress, succeeded, failed, uncertain, released), ` +
			`outcome with receipt and stored result, hold and lease times. With wait_seconds (up to 60) it waits until the operation leaves in_progress ` +
			`(an outcome, a release, a lapsed lease) and answers then, or at the end of the wait with the state then. ` +
			`The operation object of GET /v1/operations/{id} without attempts and events (docs/reference.md §4, §8). not_found for another tenant's.`,
		Annotations: &mcp.ToolAnnotations{
			Title: "Operation status",
			// A read. A wait that outlives the lease records the lapse the rules already
			// decided (docs/reference.md §8), as the next acquire or the reaper would.
			ReadOnlyHint:    true,
			IdempotentHint:  true,
			DestructiveHint: &no,
			OpenWorldHint:   &no,
		},
		InputSchema: mcpInputSchema[statusInput](nil, func(s *jsonschema.Schema) {
			s.Properties["wait_seconds"].Minimum = jsonschema.Ptr(0.0)
			s.Properties["wait_seconds"].Maximum = jsonschema.Ptr(services.MaxWait.Seconds())
		}),
		OutputSchema: mcpOutputSchema(mcpDTOSchema[operationDTO](nil)),
	}, s.mcpStatus)

	addMCPTool(s, srv, &mcp.Tool{
		Name: mcpToolListUncertain,
		Description: `The tenant's reconciliation queue: every operation in state uncertain (its effect may or may not have happened), oldest first, ` +
			`whether or not a later operation of its key exists (superseded). Check each at its destination, then record the real outcome ` +
			`(complete with its owner token, or an operator in the dashboard). Pages of up to 500; next_cursor is null on the last. ` +
			`Same as GET /v1/operations?state=uncertain (docs/reference.md §10).`,
		Annotations: &mcp.ToolAnnotations{
			Title:           "Uncertain operations",
			ReadOnlyHint:    true,
			IdempotentHint:  true,
			DestructiveHint: &no,
			OpenWorldHint:   &no,
		},
		InputSchema: mcpInputSchema[listUncertainInput](nil, func(s *jsonschema.Schema) {
			s.Properties["limit"].Minimum = jsonschema.Ptr(1.0)
			s.Properties["limit"].Maximum = jsonschema.Ptr(float64(services.MaxListLimit))
		}),
		OutputSchema: mcpOutputSchema(mcpDTOSchema[operationListResponse](nil)),
	}, s.mcpListUncertain)
	return srv
}

// addMCPTool adds tool t to srv, answered by run with the strictly decoded arguments: run's
// answer becomes the result's structuredContent (and its JSON text), its error a tool error
// (mcpFailure). The SDK validates the arguments against t.InputSchema first.
func addMCPTool[In any](s *Server, srv *mcp.Server, t *mcp.Tool, run func(call *mcpCall, in *In) (any, error)) {
	mcp.AddTool(srv, t, func(ctx context.Context, req *mcp.CallToolRequest, _ In) (*mcp.CallToolResult, any, error) {
		call, ok := ctx.Value(mcpCallKey{}).(*mcpCall)
		if !ok {
			// Every call arrives through handleMCP; without its principal, refuse (fail closed).
			return s.mcpFailure(&mcpCall{ctx: ctx}, t.Name, errors.New("mcp: a tool call without its HTTP request")), nil, nil
		}
		var in In
		if err := decodeArguments(req.Params.Arguments, &in); err != nil {
			return s.mcpFailure(call, t.Name, err), nil, nil
		}
		v, err := run(call, &in)
		if err != nil {
			return s.mcpFailure(call, t.Name, err), nil, nil
		}
		res, err := mcpAnswer(v)
		if err != nil {
			return s.mcpFailure(call, t.Name, err), nil, nil
		}
		return res, nil, nil
	})
}

// decodeArguments decodes a tool call's raw arguments into dst as the JSON API decodes a body
// (decodeJSON: one object, known members each once, no lone surrogate escapes, no coercion);
// absent arguments are an empty object. Errors: services.ErrInvalidRequest.
func decodeArguments(raw json.RawMessage, dst any) error {
	if len(raw) == 0 || string(raw) == "null" {
		raw = json.RawMessage("{}")
	}
	return decodeJSON(raw, dst)
}

// mcpAnswer is a successful tool result: v encoded once (encodeJSON, as the JSON API's bodies)
// as structuredContent, and the same JSON as text content (MCP's advice for clients without
// structured output).
func mcpAnswer(v any) (*mcp.CallToolResult, error) {
	b, err := encodeJSON(v)
	if err != nil {
		return nil, fmt.Errorf("mcp: encode answer: %w", err)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}},
		StructuredContent: json.RawMessage(b)}, nil
}

// mcpRetryAfter is the JSON API's Retry-After of a 503, in seconds.
var mcpRetryAfter, _ = strconv.Atoi(retryAfterSeconds)

// mcpFailure is the tool result of err: isError, structuredContent an mcpToolError, text
// content its code and message. Domain errors keep their code and message, and anything else
// is classified by toDomainError exactly as for the JSON API (store_unavailable, or internal
// with the cause logged and never shown). Never a JSON-RPC error: the model sees what went
// wrong and can act on it.
func (s *Server) mcpFailure(call *mcpCall, tool string, err error) *mcp.CallToolResult {
	de, internal := toDomainError(err, services.MaxBodyBytes)
	status := statusByCode[de.Code]
	if internal || status >= http.StatusInternalServerError {
		s.log.ErrorContext(call.ctx, "MCP tool call failed", "tool", tool, "code", de.Code, "err", err)
	}
	p := newProblem(status, de, call.requestID)
	te := &mcpToolError{Code: p.Code, Message: p.Detail, Errors: p.Errors, Operation: p.Operation, RequestID: p.RequestID}
	if status == http.StatusServiceUnavailable {
		te.RetryAfterSeconds = mcpRetryAfter
	}
	return mcpErrorResult(te)
}

// mcpErrorResult is the tool result of te.
func mcpErrorResult(te *mcpToolError) *mcp.CallToolResult {
	b, err := encodeJSON(te)
	if err != nil { // a struct of strings and DTOs always encodes
		b = []byte(`{"code":"internal","message":"Internal error."}`)
	}
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: te.text()}},
		StructuredContent: json.RawMessage(b)}
}

// structureSDKErrors gives the tool errors the SDK makes itself (arguments its input schema
// refuses, before the tool's handler runs) the structuredContent of every other tool error:
// code invalid_request, the SDK's text as message.
func structureSDKErrors(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		r, ok := res.(*mcp.CallToolResult)
		if err != nil || !ok || r == nil || !r.IsError || r.StructuredContent != nil {
			return res, err
		}
		te := &mcpToolError{Code: services.CodeInvalidRequest, Message: "The arguments do not match the tool's input schema."}
		for _, c := range r.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				te.Message = tc.Text
				break
			}
		}
		if call, ok := ctx.Value(mcpCallKey{}).(*mcpCall); ok {
			te.RequestID = call.requestID
		}
		return mcpErrorResult(te), nil
	}
}

// mcpAdmit is the admit tool: POST /v1/acquire (handleAcquire), with the fingerprint of
// arguments. Answers admittedResponse or duplicateResponse (acquireAnswer).
func (s *Server) mcpAdmit(call *mcpCall, in *admitInput) (any, error) {
	if in.Key == nil {
		return nil, required("key")
	}
	fingerprint := in.Fingerprint
	if in.Arguments != nil {
		if fingerprint != nil {
			return nil, fieldError("arguments", "give either fingerprint or arguments, not both")
		}
		fp, err := argumentsFingerprint(in.Arguments)
		if err != nil {
			return nil, err
		}
		fingerprint = &fp
	}
	acq, err := s.adm.Acquire(call.ctx, call.principal, services.AcquireInput{Key: *in.Key, TTLSeconds: ttlOf(in.TTLSeconds),
		Operation: in.Operation, Fingerprint: fingerprint, AttemptID: in.AttemptID, LeaseSeconds: in.LeaseSeconds,
		OnExpiry: in.OnExpiry})
	if err != nil {
		return nil, err
	}
	_, body := acquireAnswer(acq)
	return body, nil
}

// ttlOf is decodeAcquire's reading of ttl_seconds: absent is 0 (the policy's TTL), and a
// client's explicit 0 is -1, which services refuses like any value below 1.
func ttlOf(ttl *int64) int64 {
	switch {
	case ttl == nil:
		return 0
	case *ttl == 0:
		return -1
	}
	return *ttl
}

// argumentsFingerprint is admit's fingerprint of arguments (docs/reference.md §13): "sha256:"
// and the hex SHA-256 of their canonical JSON (fibermw.CanonicalJSON: members sorted by name,
// no white space, strings escaped one way, numbers by their exact value), so that member order
// and white space never matter and 9007199254740993 never equals 9007199254740992. Arguments
// without a canonical form (a repeated member name, a lone surrogate escape: two readers could
// disagree about what they say) and anything but an object are refused: invalid_request on
// field arguments.
func argumentsFingerprint(args json.RawMessage) (string, error) {
	canon, err := fibermw.CanonicalJSON(args)
	if err != nil {
		return "", fieldError("arguments", "must be a JSON object without repeated member names or lone surrogate escapes")
	}
	if len(canon) == 0 || canon[0] != '{' {
		return "", fieldError("arguments", "must be a JSON object")
	}
	sum := sha256.Sum256(canon)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// mcpComplete is the complete tool: POST /v1/operations/{id}/outcome (handleOutcome) without
// release. Answers the operation.
func (s *Server) mcpComplete(call *mcpCall, in *completeInput) (any, error) {
	if missing := missingFields("operation_id", in.OperationID, "owner_token", in.OwnerToken); missing != nil {
		return nil, missing
	}
	out := services.OutcomeInput{OwnerToken: *in.OwnerToken, Receipt: in.Receipt, Response: nullIsAbsent(in.Result), Note: in.Note}
	if in.Status != nil {
		out.Status = *in.Status
	}
	op, err := s.adm.RecordOutcome(call.ctx, call.principal, *in.OperationID, out)
	if err != nil {
		return nil, err
	}
	return toOperationDTO(op), nil
}

// mcpRelease is the release tool: POST /v1/release (handleRelease).
func (s *Server) mcpRelease(call *mcpCall, in *releaseInput) (any, error) {
	if missing := missingFields("key", in.Key, "owner_token", in.OwnerToken); missing != nil {
		return nil, missing
	}
	op, err := s.adm.Release(call.ctx, call.principal, services.ReleaseInput{Key: *in.Key, OwnerToken: *in.OwnerToken, Reason: in.Reason})
	if err != nil {
		return nil, err
	}
	return releaseResponse{Released: true, Operation: toOperationDTO(op)}, nil
}

// mcpRenew is the renew tool: POST /v1/operations/{id}/renew (handleRenew) without
// extend_ttl. An absent lease_seconds is refused by services after the owner check, as there.
func (s *Server) mcpRenew(call *mcpCall, in *renewInput) (any, error) {
	if missing := missingFields("operation_id", in.OperationID, "owner_token", in.OwnerToken); missing != nil {
		return nil, missing
	}
	rn := services.RenewInput{OwnerToken: *in.OwnerToken}
	if in.LeaseSeconds != nil {
		rn.LeaseSeconds = *in.LeaseSeconds
	}
	r, err := s.adm.Renew(call.ctx, call.principal, *in.OperationID, rn)
	if err != nil {
		return nil, err
	}
	return renewResponse{OperationID: r.OperationID, LeaseExpiresAt: r.LeaseExpiresAt, ExpiresAt: r.ExpiresAt,
		FencingToken: r.FencingToken}, nil
}

// mcpStatus is the status tool: GET /v1/operations/{id}?wait= (handleGetOperation) by
// operation_id, or by key the newest operation of GET /v1/keys/{key}. A key whose operations
// are all purged past their horizon has none: not_found, as for a key never acquired.
func (s *Server) mcpStatus(call *mcpCall, in *statusInput) (any, error) {
	if (in.Key == nil) == (in.OperationID == nil) {
		return nil, &services.Error{Code: services.CodeInvalidRequest, Message: "The request has invalid fields.",
			Fields: []services.FieldError{{Field: "key", Message: "give exactly one of key and operation_id"},
				{Field: "operation_id", Message: "give exactly one of key and operation_id"}}}
	}
	var wait time.Duration
	if w := in.WaitSeconds; w != nil {
		if *w < 0 || *w > services.MaxWait.Seconds() {
			return nil, fieldError("wait_seconds", fmt.Sprintf("must be a number of seconds from 0 to %g", services.MaxWait.Seconds()))
		}
		wait = time.Duration(*w * float64(time.Second))
	}
	id := ""
	if in.Key != nil {
		k, err := s.reads.GetKey(call.ctx, call.principal.TenantID, *in.Key)
		if err != nil {
			return nil, err
		}
		if k.Operation == nil {
			return nil, &services.Error{Code: services.CodeNotFound, Message: "The key has no operation on record: its last one was purged, and the key is free."}
		}
		if wait <= 0 || k.Operation.State != services.StateInProgress || s.awaiter == nil {
			return toOperationDTO(k.Operation), nil
		}
		id = k.Operation.ID
	} else {
		id = *in.OperationID
	}
	var d *services.OperationDetail
	var err error
	if wait > 0 && s.awaiter != nil {
		ctx, cancel := call.wait()
		d, err = s.awaiter.Wait(ctx, call.principal.TenantID, id, wait)
		cancel()
	} else {
		d, err = s.reads.GetOperation(call.ctx, call.principal.TenantID, id)
	}
	if err != nil {
		return nil, err
	}
	return toOperationDTO(&d.Operation), nil
}

// mcpListUncertain is the list_uncertain tool: GET /v1/operations?state=uncertain
// (handleListOperations), the tenant's reconciliation queue, oldest first.
func (s *Server) mcpListUncertain(call *mcpCall, in *listUncertainInput) (any, error) {
	limit := 0
	if in.Limit != nil {
		if limit = *in.Limit; limit < 1 || limit > services.MaxListLimit {
			return nil, fieldError("limit", "must be an integer from 1 to "+strconv.Itoa(services.MaxListLimit))
		}
	}
	f := services.OperationFilter{State: services.StateUncertain, Limit: limit}
	if in.Cursor != nil {
		f.Cursor = *in.Cursor
	}
	page, err := s.reads.ListOperations(call.ctx, call.principal.TenantID, f)
	if err != nil {
		return nil, err
	}
	resp := operationListResponse{Items: make([]queuedOperationDTO, 0, len(page.Items)), NextCursor: cursorPtr(page.NextCursor)}
	for i := range page.Items {
		q := &page.Items[i]
		resp.Items = append(resp.Items, queuedOperationDTO{operationDTO: toOperationDTO(&q.Operation),
			UncertainAt: q.UncertainAt.UTC(), Superseded: q.Superseded})
	}
	return resp, nil
}

// missingFields refuses, as the JSON API does (required), the named arguments that are nil:
// pairs of a name and a *string.
func missingFields(pairs ...any) error {
	var missing []string
	for i := 0; i+1 < len(pairs); i += 2 {
		if v, _ := pairs[i+1].(*string); v == nil {
			missing = append(missing, pairs[i].(string))
		}
	}
	if missing == nil {
		return nil
	}
	return required(missing...)
}

// mcpSchemaTypes are the schemas of Go types the inference gets wrong for this API: a
// json.RawMessage (metadata, a stored result, arguments) is any JSON value, not an array of
// bytes.
var mcpSchemaTypes = map[reflect.Type]*jsonschema.Schema{reflect.TypeFor[json.RawMessage](): {}}

// mcpInputSchema is the input schema inferred from In's fields and their jsonschema tags
// (descriptions). Optional members are plain types rather than type-or-null, required are
// the members the JSON API requires before it reads anything (a member services checks, such
// as complete's status, is refused by services after the owner check, as on /v1), and tweak
// adds what tags cannot say (enums, bounds). It panics on a type the inference refuses: a
// bug, found when the server is built.
func mcpInputSchema[In any](required []string, tweak func(*jsonschema.Schema)) *jsonschema.Schema {
	s, err := jsonschema.For[In](&jsonschema.ForOptions{TypeSchemas: mcpSchemaTypes})
	if err != nil {
		panic(err)
	}
	for _, p := range s.Properties {
		if len(p.Types) == 2 && p.Types[0] == "null" {
			p.Type, p.Types = p.Types[1], nil
		}
	}
	s.Required = required
	if tweak != nil {
		tweak(s)
	}
	return s
}

// mcpDTOSchema is the schema inferred from the JSON API's response type T (api_types.go), with
// descriptions of its top-level members.
func mcpDTOSchema[T any](descriptions map[string]string) *jsonschema.Schema {
	s, err := jsonschema.For[T](&jsonschema.ForOptions{TypeSchemas: mcpSchemaTypes})
	if err != nil {
		panic(err)
	}
	for name, d := range descriptions {
		s.Properties[name].Description = d
	}
	return s
}

// mcpOutputSchema is a tool's output schema: an object that is one of the tool's answers or,
// when isError is true, an mcpToolError.
func mcpOutputSchema(answers ...*jsonschema.Schema) *jsonschema.Schema {
	return &jsonschema.Schema{Type: "object", AnyOf: append(answers, mcpDTOSchema[mcpToolError](nil))}
}
