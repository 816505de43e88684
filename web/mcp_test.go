package web

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/idemgate/idemgate/internal/testkit"
	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
	"github.com/idemgate/idemgate/web/client/fibermw"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"
)

// serveMCP serves s on a loopback port until the test ends and returns its /mcp URL.
func serveMCP(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan struct{})
	go func() { defer close(served); _ = s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
		<-served
	})
	return "http://" + ln.Addr().String() + mcpPath
}

// bearerTransport adds the API key to every request, as an MCP client configured with it does.
type bearerTransport struct{ key string }

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}

// mcpAgent is one MCP client (the Go SDK's) of a server, as one tenant's API key.
type mcpAgent struct {
	t       *testing.T
	cs      *mcp.ClientSession
	schemas map[string]*jsonschema.Resolved // output schema by tool
	tools   []*mcp.Tool
}

func newMCPAgent(t *testing.T, endpoint, key string) *mcpAgent {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "idemgate-test", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: endpoint,
		HTTPClient: &http.Client{Transport: bearerTransport{key}}, MaxRetries: -1}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	a := &mcpAgent{t: t, cs: cs, schemas: map[string]*jsonschema.Resolved{}}
	list, err := cs.ListTools(context.Background(), nil)
	require.NoError(t, err)
	a.tools = list.Tools
	for _, tool := range list.Tools {
		require.NotNil(t, tool.OutputSchema, tool.Name)
		var s jsonschema.Schema
		remarshal(t, tool.OutputSchema, &s)
		r, err := s.Resolve(nil)
		require.NoError(t, err, tool.Name)
		a.schemas[tool.Name] = r
	}
	return a
}

// with is a for subtest t: its failures fail t.
func (a *mcpAgent) with(t *testing.T) *mcpAgent {
	c := *a
	c.t = t
	return &c
}

func remarshal(t *testing.T, from, to any) {
	t.Helper()
	b, err := json.Marshal(from)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, to))
}

// mcpResult is one tool call's answer: its structured content (numbers exact, from the text
// content of a success, which is the same JSON) and, for a refusal, its code.
type mcpResult struct {
	isError bool
	out     map[string]any
	code    string
	text    string
}

// call calls the tool with args (any JSON value; a json.RawMessage is sent as written) and
// checks what every answer must be: structured content that matches the tool's output schema,
// with text content beside it.
func (a *mcpAgent) call(tool string, args any) mcpResult {
	a.t.Helper()
	res, err := a.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	require.NoError(a.t, err, "a tool's refusal is a result, never a protocol error")
	require.NotNil(a.t, res.StructuredContent, "every answer has structured content")
	require.Len(a.t, res.Content, 1)
	text := res.Content[0].(*mcp.TextContent).Text
	var generic any
	remarshal(a.t, res.StructuredContent, &generic)
	require.NoError(a.t, a.schemas[tool].Validate(generic), "%s's answer matches its output schema: %s", tool, text)
	r := mcpResult{isError: res.IsError, text: text}
	if res.IsError {
		remarshal(a.t, res.StructuredContent, &r.out)
		r.code, _ = r.out["code"].(string)
		require.NotEmpty(a.t, r.code, text)
		require.NotEmpty(a.t, r.out["message"], text)
		require.Contains(a.t, text, r.out["message"].(string), "the text content says what went wrong")
		return r
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	require.NoError(a.t, dec.Decode(&r.out), "a success's text content is its JSON: %s", text)
	var fromText any
	require.NoError(a.t, json.Unmarshal([]byte(text), &fromText))
	require.Equal(a.t, generic, fromText, "the text content is the structured content")
	return r
}

// ok asserts the call succeeded and returns its structured content.
func (a *mcpAgent) ok(tool string, args any) map[string]any {
	a.t.Helper()
	r := a.call(tool, args)
	require.False(a.t, r.isError, "%s: %s", tool, r.text)
	return r.out
}

// refused asserts the call is a tool error with code and returns its structured content.
func (a *mcpAgent) refused(tool string, args any, code string) map[string]any {
	a.t.Helper()
	r := a.call(tool, args)
	require.True(a.t, r.isError, "%s should be refused with %s: %s", tool, code, r.text)
	require.Equal(a.t, code, r.code, r.text)
	return r.out
}

// mcpWorld is a server on a real socket and one tenant's MCP agent.
type mcpWorld struct {
	s        *Server
	db       *models.DB
	endpoint string
	key      string
	agent    *mcpAgent
}

func newMCPWorld(t *testing.T, db *models.DB) *mcpWorld {
	t.Helper()
	s := newTestServer(t, db)
	w := &mcpWorld{s: s, db: db, endpoint: serveMCP(t, s)}
	w.key = newTenantClient(t, s).key
	w.agent = newMCPAgent(t, w.endpoint, w.key)
	return w
}

// principal is the world's tenant.
func (w *mcpWorld) principal(t *testing.T) services.Principal {
	p, err := w.s.auth.Authenticate(context.Background(), w.key)
	require.NoError(t, err)
	return p
}

func num(t *testing.T, v any) int64 {
	t.Helper()
	n, err := v.(json.Number).Int64()
	require.NoError(t, err)
	return n
}

func fieldsOf(out map[string]any) []string {
	var names []string
	errs, _ := out["errors"].([]any)
	for _, e := range errs {
		names = append(names, e.(map[string]any)["field"].(string))
	}
	return names
}

// TestMCPToolsList: the six tools, each with an input and an output schema, and the
// annotations docs/reference.md §13 gives them.
func TestMCPToolsList(t *testing.T) {
	t.Parallel()
	w := newMCPWorld(t, dbs.SQLite)
	type hints struct{ readOnly, idempotent, destructive bool }
	want := map[string]hints{
		"admit":          {false, false, false},
		"complete":       {false, true, false},
		"release":        {false, true, true},
		"renew":          {false, true, false},
		"status":         {true, true, false},
		"list_uncertain": {true, true, false},
	}
	require.Len(t, w.agent.tools, len(want))
	for _, tool := range w.agent.tools {
		h, ok := want[tool.Name]
		require.True(t, ok, "unexpected tool %s", tool.Name)
		require.NotEmpty(t, tool.Description)
		var in, out map[string]any
		remarshal(t, tool.InputSchema, &in)
		remarshal(t, tool.OutputSchema, &out)
		require.Equal(t, "object", in["type"], tool.Name)
		require.NotEmpty(t, in["properties"], tool.Name)
		require.Equal(t, "object", out["type"], tool.Name)
		require.NotEmpty(t, out["anyOf"], tool.Name)
		a := tool.Annotations
		require.NotNil(t, a, tool.Name)
		require.Equal(t, h.readOnly, a.ReadOnlyHint, tool.Name)
		require.Equal(t, h.idempotent, a.IdempotentHint, tool.Name)
		require.NotNil(t, a.DestructiveHint, tool.Name)
		require.Equal(t, h.destructive, *a.DestructiveHint, tool.Name)
		require.NotNil(t, a.OpenWorldHint, tool.Name)
		require.False(t, *a.OpenWorldHint, tool.Name)
	}
	admit := w.agent.tools[0]
	for _, tool := range w.agent.tools {
		if tool.Name == "admit" {
			admit = tool
		}
	}
	for _, guarantee := range []string{"tenant", "At most one admission per key", "uncertain", "previous_operation",
		"fingerprint", "expires_at"} {
		require.Contains(t, admit.Description, guarantee)
	}
}

// TestMCPAdmitCompleteStatusRelease walks the JSON API's first calls through MCP, on both
// dialects: admitted, a duplicate naming the holder, other arguments refused, the outcome
// recorded with a result and read back, a release with another owner token refused.
func TestMCPAdmitCompleteStatusRelease(t *testing.T) {
	t.Parallel()
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		t.Parallel()
		w := newMCPWorld(t, db)
		a := w.agent
		key := "charge:order-" + dashRandom()
		args := map[string]any{"amount": 1200, "currency": "EUR"}
		adm := a.ok("admit", map[string]any{"key": key, "operation": "charge", "ttl_seconds": 60, "arguments": args})
		require.Equal(t, true, adm["admitted"])
		require.Equal(t, "in_progress", adm["state"])
		require.EqualValues(t, 1, num(t, adm["fencing_token"]))
		require.True(t, strings.HasPrefix(adm["owner_token"].(string), "ot_"))
		require.NotContains(t, adm, "previous_operation")
		opID, owner := adm["operation_id"].(string), adm["owner_token"].(string)

		// The same arguments in another order and spacing: the same request, a duplicate
		// naming the holder, without its owner token.
		dup := a.call("admit", json.RawMessage(`{"key":"`+key+`","operation":"charge","ttl_seconds":60,
			"arguments":{ "currency" : "EUR", "amount" : 1.2e3 }}`))
		require.False(t, dup.isError, dup.text)
		require.Equal(t, false, dup.out["admitted"])
		holder := dup.out["operation"].(map[string]any)
		require.Equal(t, opID, holder["id"])
		require.Equal(t, "in_progress", holder["state"])
		require.NotContains(t, dup.text, "owner_token")
		canon, err := fibermw.CanonicalJSON([]byte(`{"amount":1200,"currency":"EUR"}`))
		require.NoError(t, err)
		sum := sha256.Sum256(canon)
		require.Equal(t, "sha256:"+hex.EncodeToString(sum[:]), holder["fingerprint"],
			"the fingerprint of arguments is sha256: and the hex SHA-256 of their canonical JSON")

		// Other arguments, or another fingerprint: a conflict, never a duplicate.
		a.refused("admit", map[string]any{"key": key, "operation": "charge", "ttl_seconds": 60,
			"arguments": map[string]any{"amount": 1300, "currency": "EUR"}}, "fingerprint_mismatch")
		a.refused("admit", map[string]any{"key": key, "operation": "charge", "ttl_seconds": 60,
			"fingerprint": "fp-other"}, "fingerprint_mismatch")
		bad := a.refused("admit", map[string]any{"key": key, "ttl_seconds": 60, "fingerprint": "x",
			"arguments": args}, "invalid_request")
		require.Equal(t, []string{"arguments"}, fieldsOf(bad))

		// A wrong owner token is refused; the holder's is not.
		a.refused("release", map[string]any{"key": key, "owner_token": "ot_not-the-owner"}, "not_owner")
		a.refused("complete", map[string]any{"operation_id": opID, "owner_token": "ot_not-the-owner",
			"status": "succeeded"}, "not_owner")
		renewed := a.ok("renew", map[string]any{"operation_id": opID, "owner_token": owner, "lease_seconds": 30})
		require.Equal(t, opID, renewed["operation_id"])

		done := a.ok("complete", map[string]any{"operation_id": opID, "owner_token": owner, "status": "succeeded",
			"receipt": "ch_3PZ", "result": map[string]any{"charge": "ch_3PZ", "amount": 1200}})
		require.Equal(t, "succeeded", done["state"])
		outcome := done["outcome"].(map[string]any)
		require.Equal(t, "ch_3PZ", outcome["receipt"])
		require.Equal(t, "ch_3PZ", outcome["response"].(map[string]any)["charge"])
		again := a.ok("complete", map[string]any{"operation_id": opID, "owner_token": owner, "status": "succeeded",
			"receipt": "ch_3PZ", "result": map[string]any{"charge": "ch_3PZ", "amount": 1200}})
		require.Equal(t, done, again, "the same outcome again changes nothing")
		a.refused("complete", map[string]any{"operation_id": opID, "owner_token": owner, "status": "failed"},
			"invalid_transition")

		for _, by := range []map[string]any{{"operation_id": opID}, {"key": key}} {
			st := a.ok("status", by)
			require.Equal(t, opID, st["id"])
			require.Equal(t, "succeeded", st["state"])
			require.Equal(t, "ch_3PZ", st["outcome"].(map[string]any)["receipt"])
			require.Equal(t, "ch_3PZ", st["outcome"].(map[string]any)["response"].(map[string]any)["charge"])
		}
		dup = a.call("admit", map[string]any{"key": key, "operation": "charge", "ttl_seconds": 60, "arguments": args})
		require.Equal(t, "succeeded", dup.out["operation"].(map[string]any)["state"], "a duplicate gets the outcome")
		a.refused("release", map[string]any{"key": key, "owner_token": owner}, "effect_confirmed")

		// A key released by its owner is admitted again.
		free := "free-" + dashRandom()
		adm = a.ok("admit", map[string]any{"key": free, "ttl_seconds": 60})
		rel := a.ok("release", map[string]any{"key": free, "owner_token": adm["owner_token"], "reason": "declined"})
		require.Equal(t, true, rel["released"])
		require.Equal(t, "released", rel["operation"].(map[string]any)["state"])
		a.refused("release", map[string]any{"key": free, "owner_token": adm["owner_token"]}, "key_not_held")
		require.Equal(t, true, a.ok("admit", map[string]any{"key": free, "ttl_seconds": 60})["admitted"])

		// Refusals of the arguments themselves, by the input schema or by the handler, carry
		// invalid_request.
		a.refused("status", map[string]any{}, "invalid_request")
		a.refused("status", map[string]any{"key": key, "operation_id": opID}, "invalid_request")
		a.refused("status", map[string]any{"operation_id": opID, "wait_seconds": 61}, "invalid_request")
		a.refused("admit", map[string]any{"key": key, "ttl_seconds": "60"}, "invalid_request")
		a.refused("admit", map[string]any{"ttl_seconds": 60}, "invalid_request")
		a.refused("admit", map[string]any{"key": key, "ttl_seconds": 60, "on_expiry": "never"}, "invalid_request")
		a.refused("admit", map[string]any{"key": "k-" + dashRandom(), "ttl_seconds": 0}, "invalid_request")
		a.refused("list_uncertain", map[string]any{"limit": 0}, "invalid_request")
		a.refused("status", map[string]any{"operation_id": "0b6e0000-0000-7000-8000-000000000000"}, "not_found")
		a.refused("status", map[string]any{"key": "never-" + dashRandom()}, "not_found")
	})
}

// TestMCPArgumentsAreReadAsSent: the tools read the arguments as sent, as the JSON API reads
// a body, not as the SDK's decoding into map[string]any left them (the faults each line
// would show with the SDK's typed arguments and output).
func TestMCPArgumentsAreReadAsSent(t *testing.T) {
	t.Parallel()
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		t.Parallel()
		w := newMCPWorld(t, db)
		a := w.agent
		t.Run("numbers in arguments are exact", func(t *testing.T) {
			a := a.with(t)
			// Two amounts a double cannot tell apart are two requests: a conflict, not a
			// duplicate answered with the first one's outcome.
			key := "big-" + dashRandom()
			a.ok("admit", json.RawMessage(`{"key":"`+key+`","ttl_seconds":60,"arguments":{"amount":9007199254740993}}`))
			a.refused("admit", json.RawMessage(`{"key":"`+key+`","ttl_seconds":60,"arguments":{"amount":9007199254740992}}`),
				"fingerprint_mismatch")
		})
		key := "result-" + dashRandom()
		adm := a.ok("admit", map[string]any{"key": key, "ttl_seconds": 60})
		t.Run("a stored result keeps its bytes", func(t *testing.T) {
			a := a.with(t)
			// Its digits and its characters, in complete's answer and in status.
			done := a.call("complete", json.RawMessage(`{"operation_id":"`+adm["operation_id"].(string)+`","owner_token":"`+
				adm["owner_token"].(string)+`","status":"succeeded","result":{"amount":9007199254740993,"html":"<b>&</b>"}}`))
			require.False(t, done.isError, done.text)
			require.Contains(t, done.text, `"response":{"amount":9007199254740993,"html":"<b>&</b>"}`)
			st := a.call("status", map[string]any{"key": key})
			require.Contains(t, st.text, `"response":{"amount":9007199254740993,"html":"<b>&</b>"}`)
		})
		t.Run("lone surrogate escapes are refused", func(t *testing.T) {
			a := a.with(t)
			// Decoded, one becomes U+FFFD, so two different keys would be one: refused, as on /v1.
			bad := a.refused("admit", json.RawMessage(`{"key":"k-\ud800","ttl_seconds":60}`), "invalid_request")
			require.Equal(t, []string{"key"}, fieldsOf(bad))
		})
		t.Run("repeated members are refused", func(t *testing.T) {
			a := a.with(t)
			// Not decided by whichever of them a parser keeps.
			bad := a.refused("admit", json.RawMessage(`{"key":"a-`+dashRandom()+`","key":"b","ttl_seconds":60}`), "invalid_request")
			require.Equal(t, []string{"key"}, fieldsOf(bad))
			bad = a.refused("admit", json.RawMessage(`{"key":"c-`+dashRandom()+`","ttl_seconds":60,"arguments":{"a":1,"a":2}}`),
				"invalid_request")
			require.Equal(t, []string{"arguments"}, fieldsOf(bad))
		})

		// NUL in any string argument is refused or not found, never an internal error.
		op, owner := adm["operation_id"].(string), adm["owner_token"].(string)
		for tool, args := range map[string][]map[string]any{
			"admit": {{"key": "\x00"}, {"key": "k", "operation": "\x00"}, {"key": "k", "fingerprint": "\x00"},
				{"key": "k", "attempt_id": "\x00"}, {"key": "k", "on_expiry": "\x00"}},
			"complete": {{"operation_id": "\x00", "owner_token": owner}, {"operation_id": op, "owner_token": "\x00"},
				{"operation_id": op, "owner_token": owner, "status": "\x00"},
				{"operation_id": op, "owner_token": owner, "status": "failed", "receipt": "\x00"},
				{"operation_id": op, "owner_token": owner, "status": "failed", "note": "\x00"}},
			"release":        {{"key": "\x00", "owner_token": owner}, {"key": key, "owner_token": "\x00"}, {"key": key, "owner_token": owner, "reason": "\x00"}},
			"renew":          {{"operation_id": "\x00", "owner_token": owner}, {"operation_id": op, "owner_token": "\x00"}},
			"status":         {{"key": "\x00"}, {"operation_id": "\x00"}},
			"list_uncertain": {{"cursor": "\x00"}},
		} {
			for _, arg := range args {
				if tool == "admit" {
					arg["ttl_seconds"] = 60
				}
				r := a.call(tool, arg)
				require.True(t, r.isError, "%s %v: %s", tool, arg, r.text)
				require.Contains(t, []string{"invalid_request", "not_found", "not_owner", "key_not_held"}, r.code,
					"%s %v: %s", tool, arg, r.text)
			}
		}
	})
}

// TestMCPLeaseLapseIsUncertain: a holder that stops (its lease lapses) leaves its operation
// uncertain: admit answers outcome_uncertain with it while the TTL runs, list_uncertain lists
// it, and after the TTL a new admission carries previous_operation naming it.
func TestMCPLeaseLapseIsUncertain(t *testing.T) {
	t.Parallel()
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		t.Parallel()
		w := newMCPWorld(t, db)
		a := w.agent
		key := "payout:" + dashRandom()
		req := map[string]any{"key": key, "operation": "payout", "ttl_seconds": 60, "lease_seconds": 5, "fingerprint": "fp-1"}
		first := a.ok("admit", req)
		opID := first["operation_id"].(string)
		elapse(t, db, w.principal(t), 6*time.Second, key)

		refused := a.refused("admit", req, "outcome_uncertain")
		op := refused["operation"].(map[string]any)
		require.Equal(t, opID, op["id"])
		require.Equal(t, "uncertain", op["state"])
		require.Equal(t, "lease_expired_without_outcome", op["state_reason"])
		a.refused("renew", map[string]any{"operation_id": opID, "owner_token": first["owner_token"], "lease_seconds": 5},
			"lease_expired")
		a.refused("release", map[string]any{"key": key, "owner_token": first["owner_token"]}, "outcome_uncertain")

		queue := a.ok("list_uncertain", map[string]any{"limit": 500})
		var listed []string
		for _, it := range queue["items"].([]any) {
			listed = append(listed, it.(map[string]any)["id"].(string))
		}
		require.Contains(t, listed, opID)
		require.Nil(t, queue["next_cursor"])
		// Pages: one per call, the cursor leads on.
		a.ok("admit", map[string]any{"key": key + "-2", "ttl_seconds": 60, "lease_seconds": 1})
		elapse(t, db, w.principal(t), 2*time.Second, key+"-2")
		a.refused("admit", map[string]any{"key": key + "-2", "ttl_seconds": 60, "lease_seconds": 1}, "outcome_uncertain")
		page := a.ok("list_uncertain", map[string]any{"limit": 1})
		require.Len(t, page["items"], 1)
		require.NotNil(t, page["next_cursor"])
		next := a.ok("list_uncertain", map[string]any{"limit": 1, "cursor": page["next_cursor"]})
		require.Len(t, next["items"], 1)
		require.NotEqual(t, page["items"].([]any)[0].(map[string]any)["id"], next["items"].([]any)[0].(map[string]any)["id"])

		// After the TTL the key is admitted again, never silently: previous_operation names it.
		elapse(t, db, w.principal(t), time.Minute, key)
		again := a.ok("admit", req)
		require.Equal(t, true, again["admitted"])
		require.EqualValues(t, 2, num(t, again["fencing_token"]))
		prev := again["previous_operation"].(map[string]any)
		require.Equal(t, opID, prev["id"])
		require.Equal(t, "uncertain", prev["state"])
	})
}

// TestMCPStatusWaitsForOutcome: status with wait_seconds answers as soon as another caller
// records the outcome, by operation_id and by key, without waiting out its wait.
func TestMCPStatusWaitsForOutcome(t *testing.T) {
	t.Parallel()
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		t.Parallel()
		w := newMCPWorld(t, db)
		holder := newMCPAgent(t, w.endpoint, w.key)
		for _, by := range []string{"operation_id", "key"} {
			key := "wait-" + dashRandom()
			adm := holder.ok("admit", map[string]any{"key": key, "ttl_seconds": 120})
			args := map[string]any{"key": key, "wait_seconds": 30}
			if by == "operation_id" {
				args = map[string]any{"operation_id": adm["operation_id"], "wait_seconds": 30}
			}
			waiting := w.s.awaiter.Waiting()
			answered := make(chan map[string]any, 1)
			start := time.Now()
			go func() {
				res, err := w.agent.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "status", Arguments: args})
				if err != nil || res.IsError {
					answered <- nil
					return
				}
				var out map[string]any
				b, _ := json.Marshal(res.StructuredContent)
				_ = json.Unmarshal(b, &out) // checked by the test: nil fails it
				answered <- out
			}()
			require.Eventually(t, func() bool { return w.s.awaiter.Waiting() > waiting }, 10*time.Second, 5*time.Millisecond,
				"the status call waits")
			holder.ok("complete", map[string]any{"operation_id": adm["operation_id"], "owner_token": adm["owner_token"],
				"status": "succeeded", "receipt": "r-1"})
			select {
			case out := <-answered:
				require.NotNil(t, out, by)
				require.Equal(t, "succeeded", out["state"], by)
				require.Equal(t, adm["operation_id"], out["id"], by)
			case <-time.After(20 * time.Second):
				t.Fatalf("status by %s did not answer when the outcome was recorded", by)
			}
			require.Less(t, time.Since(start), 25*time.Second, by)
		}
	})
}

// TestMCPConcurrentAdmitsAdmitOne: 32 agents admit one key at once through /mcp: exactly one
// is admitted, the others are told it is a duplicate.
func TestMCPConcurrentAdmitsAdmitOne(t *testing.T) {
	t.Parallel()
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		t.Parallel()
		w := newMCPWorld(t, db)
		const n = 32
		agents := make([]*mcpAgent, n)
		for i := range agents {
			agents[i] = newMCPAgent(t, w.endpoint, w.key)
		}
		key := "race-" + dashRandom()
		args := map[string]any{"key": key, "ttl_seconds": 60, "arguments": map[string]any{"amount": 5}}
		start := make(chan struct{})
		results := make([]*mcp.CallToolResult, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range agents {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				results[i], errs[i] = agents[i].cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "admit", Arguments: args})
			}()
		}
		close(start)
		wg.Wait()
		admitted, duplicates := 0, 0
		var opID string
		for i := range results {
			require.NoError(t, errs[i])
			require.False(t, results[i].IsError, "%v", results[i].Content)
			var out map[string]any
			remarshal(t, results[i].StructuredContent, &out)
			if out["admitted"] == true {
				admitted++
				opID = out["operation_id"].(string)
			} else {
				duplicates++
			}
		}
		require.Equal(t, 1, admitted)
		require.Equal(t, n-1, duplicates)
		for i := range results {
			var out map[string]any
			remarshal(t, results[i].StructuredContent, &out)
			if out["admitted"] == false {
				require.Equal(t, opID, out["operation"].(map[string]any)["id"], "every duplicate names the one admitted")
			}
		}
	})
}

// TestMCPRequiresAPIKey: /mcp without an API key, or with a wrong one, is 401 problem+json
// with a Bearer challenge, like /v1, and no tool runs.
func TestMCPRequiresAPIKey(t *testing.T) {
	t.Parallel()
	w := newMCPWorld(t, dbs.SQLite)
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",` +
		`"capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	for _, auth := range []string{"", "Bearer idg_not-a-key", "Basic " + w.key} {
		req, err := http.NewRequest(http.MethodPost, w.endpoint, strings.NewReader(initialize))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%q: %s", auth, body)
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
		require.Equal(t, `Bearer realm="idemgate"`, resp.Header.Get("WWW-Authenticate"))
		var p map[string]any
		require.NoError(t, json.Unmarshal(body, &p))
		require.Equal(t, "unauthorized", p["code"])
		require.NotEmpty(t, p["request_id"])
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "x", Version: "1"}, nil)
	_, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: w.endpoint, MaxRetries: -1}, nil)
	require.Error(t, err, "an MCP client without the API key cannot connect")

	// Stateless: no SSE stream to open and no session to end (405), any POST is a whole
	// exchange (a tools/call without initialize), and the answers are JSON, not event streams.
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		req, err := http.NewRequest(method, w.endpoint, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+w.key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, method)
	}
	raw, refused, out := mcpCallInProcess(t, w.s, w.key, "list_uncertain", map[string]any{})
	require.False(t, refused, raw)
	require.Empty(t, out["items"])
	req, err := http.NewRequest(http.MethodPost, w.endpoint, strings.NewReader(initialize))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+w.key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	require.Empty(t, resp.Header.Get("Mcp-Session-Id"), "stateless: no session")
	require.NotEmpty(t, resp.Header.Get("X-Request-ID"))
	require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
	require.True(t, json.Valid(body), "%s", body)
}

// TestMCPTenantIsolation: an API key of another tenant sees and touches nothing of this
// tenant's keys and operations through /mcp (docs/reference.md §1.6): not_found, key_not_held,
// an empty queue, and the same key name is its own key.
func TestMCPTenantIsolation(t *testing.T) {
	t.Parallel()
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		t.Parallel()
		w := newMCPWorld(t, db)
		a := w.agent
		key := "shared-" + dashRandom()
		adm := a.ok("admit", map[string]any{"key": key, "ttl_seconds": 60, "lease_seconds": 1, "fingerprint": "a"})
		opID, owner := adm["operation_id"].(string), adm["owner_token"].(string)
		gone := "gone-" + dashRandom()
		a.ok("admit", map[string]any{"key": gone, "ttl_seconds": 60, "lease_seconds": 1})
		elapse(t, db, w.principal(t), 2*time.Second, gone)
		a.refused("admit", map[string]any{"key": gone, "ttl_seconds": 60, "lease_seconds": 1}, "outcome_uncertain")

		b := newMCPAgent(t, w.endpoint, newTenantClient(t, w.s).key)
		b.refused("status", map[string]any{"key": key}, "not_found")
		b.refused("status", map[string]any{"operation_id": opID}, "not_found")
		b.refused("status", map[string]any{"operation_id": opID, "wait_seconds": 1}, "not_found")
		b.refused("complete", map[string]any{"operation_id": opID, "owner_token": owner, "status": "failed"}, "not_found")
		b.refused("renew", map[string]any{"operation_id": opID, "owner_token": owner, "lease_seconds": 1}, "not_found")
		b.refused("release", map[string]any{"key": key, "owner_token": owner}, "key_not_held")
		queue := b.ok("list_uncertain", map[string]any{})
		require.Empty(t, queue["items"])
		mine := b.ok("admit", map[string]any{"key": key, "ttl_seconds": 60, "fingerprint": "b"})
		require.Equal(t, true, mine["admitted"], "the same key name in another tenant is another key")
		require.EqualValues(t, 1, num(t, mine["fencing_token"]))
		require.NotEqual(t, opID, mine["operation_id"])

		st := a.ok("status", map[string]any{"operation_id": opID})
		require.Equal(t, "in_progress", st["state"], "nothing of A's changed")
		require.Equal(t, "a", st["fingerprint"])
		require.Len(t, a.ok("list_uncertain", map[string]any{})["items"], 1)
	})
}

// TestMCPStoreUnavailable: a database that cannot be reached is a tool error with code
// store_unavailable and a retry delay, as the JSON API's 503, not a protocol error or internal.
func TestMCPStoreUnavailable(t *testing.T) {
	t.Parallel()
	px := testkit.NewProxy(t, "")
	u, err := url.Parse(px.Via(t, dbs.PostgresURL))
	require.NoError(t, err)
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	db, err := models.Open(context.Background(), models.OpenOptions{DatabaseURL: u.String(), MaxConns: 4})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	s := New(testConfig(t, db, slog.New(slog.DiscardHandler)))
	endpoint := serveMCP(t, s)
	a := newMCPAgent(t, endpoint, newTenantClient(t, s).key)
	// API keys are cached for a second (services.Auth), so the key is known while the database
	// is down; a call that finds the cache lapsed is answered 503 by the HTTP layer: try again.
	var out map[string]any
	for try := 0; out == nil; try++ {
		require.Less(t, try, 20, "no call reached the tool while the database was down")
		px.SetDown(false)
		a.ok("list_uncertain", map[string]any{})
		px.SetDown(true)
		res, err := a.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "admit",
			Arguments: map[string]any{"key": "down-" + dashRandom(), "ttl_seconds": 60}})
		if err != nil {
			continue
		}
		require.True(t, res.IsError)
		remarshal(t, res.StructuredContent, &out)
	}
	px.SetDown(false)
	require.Equal(t, "store_unavailable", out["code"])
	require.EqualValues(t, 2, out["retry_after_seconds"])
	require.NotEmpty(t, out["request_id"])
}

// TestMCPTypeScriptClient: the reference TypeScript SDK, an MCP client no one here wrote,
// connects with the API key, lists the tools and calls admit, complete, status and refused
// calls. It validates every structured answer, refusals included, against the tool's output
// schema, and would throw on one that does not match.
func TestMCPTypeScriptClient(t *testing.T) {
	t.Parallel()
	script := testkit.NodeScript(t, "testdata/mcp_client.mjs")
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		t.Parallel()
		s := newTestServer(t, db)
		endpoint := serveMCP(t, s)
		key := newTenantClient(t, s).key
		line := testkit.StartNode(t, script, endpoint, key, "ts-"+dashRandom())
		var got struct {
			Error       string          `json:"error"`
			Tools       []string        `json:"tools"`
			ReadOnly    []string        `json:"read_only"`
			Admitted    bool            `json:"admitted"`
			Duplicate   bool            `json:"duplicate_names_holder"`
			Conflict    string          `json:"conflict"`
			Completed   string          `json:"completed"`
			Status      string          `json:"status"`
			Result      json.RawMessage `json:"result"`
			NotOwner    string          `json:"not_owner"`
			Invalid     string          `json:"invalid"`
			InvalidText string          `json:"invalid_text"`
			Uncertain   int             `json:"uncertain"`
		}
		require.NoError(t, json.Unmarshal([]byte(line), &got), line)
		require.Empty(t, got.Error, line)
		require.ElementsMatch(t, []string{"admit", "complete", "release", "renew", "status", "list_uncertain"}, got.Tools)
		require.ElementsMatch(t, []string{"status", "list_uncertain"}, got.ReadOnly)
		require.True(t, got.Admitted, line)
		require.True(t, got.Duplicate, line)
		require.Equal(t, "fingerprint_mismatch", got.Conflict, line)
		require.Equal(t, "succeeded", got.Completed, line)
		require.Equal(t, "succeeded", got.Status, line)
		require.JSONEq(t, `{"charge":"ch_1","amount":1200}`, string(got.Result))
		require.Equal(t, "not_owner", got.NotOwner, line)
		require.Equal(t, "invalid_request", got.Invalid, line)
		require.NotEmpty(t, got.InvalidText, line)
		require.Zero(t, got.Uncertain, line)
	})
}

// TestMCPBodyLimit: a request over the API's body limit is refused before MCP reads it, as
// on /v1: 413 problem+json, from the declared length alone.
func TestMCPBodyLimit(t *testing.T) {
	t.Parallel()
	w := newMCPWorld(t, dbs.SQLite)
	u, err := url.Parse(w.endpoint)
	require.NoError(t, err)
	conn, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.Write([]byte("POST " + mcpPath + " HTTP/1.1\r\nHost: " + u.Host + "\r\nContent-Type: application/json\r\n" +
		"Accept: application/json, text/event-stream\r\nAuthorization: Bearer " + w.key + "\r\n" +
		"Content-Length: " + strconv.Itoa(services.MaxBodyBytes+1) + "\r\n\r\n"))
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
}

// TestMCPStatusWaitOutlastsStoreTimeout: a status call may wait longer than the store timeout
// that bounds each request's database work (the JSON API's ?wait= does too): the answer comes
// with the outcome recorded after the store timeout, not an empty response at the deadline.
func TestMCPStatusWaitOutlastsStoreTimeout(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t, dbs.SQLite, slog.New(slog.DiscardHandler))
	cfg.StoreTimeout = 2 * time.Second
	s := New(cfg)
	endpoint := serveMCP(t, s)
	key := newTenantClient(t, s).key
	a := newMCPAgent(t, endpoint, key)
	holder := newMCPAgent(t, endpoint, key)
	adm := a.ok("admit", map[string]any{"key": "slow-" + dashRandom(), "ttl_seconds": 60})
	waiting := s.awaiter.Waiting()
	go func() {
		for end := time.Now().Add(10 * time.Second); s.awaiter.Waiting() == waiting && time.Now().Before(end); {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(cfg.StoreTimeout + time.Second)
		_, _ = holder.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "complete", Arguments: map[string]any{
			"operation_id": adm["operation_id"], "owner_token": adm["owner_token"], "status": "succeeded"}})
	}()
	start := time.Now()
	st := a.ok("status", map[string]any{"operation_id": adm["operation_id"], "wait_seconds": 20})
	require.Equal(t, "succeeded", st["state"])
	require.Greater(t, time.Since(start), cfg.StoreTimeout)
}

// mcpCallInProcess calls tool with args through POST /mcp of s, in process (app.Test, as the
// route tables of isolation_test.go and params_test.go call every route), with API key key:
// one stateless JSON-RPC exchange. It returns the raw HTTP answer, whether the tool refused
// the call, and its structured content.
func mcpCallInProcess(t *testing.T, s *Server, key, tool string, args map[string]any) (raw string, isError bool, out map[string]any) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
		"params": map[string]any{"name": tool, "arguments": args}})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, mcpPath, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := s.app.Test(req, -1)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", tool, b)
	var rpc struct {
		Result struct {
			IsError           bool           `json:"isError"`
			StructuredContent map[string]any `json:"structuredContent"`
		} `json:"result"`
	}
	require.NoError(t, json.Unmarshal(b, &rpc), "%s", b)
	require.NotNil(t, rpc.Result.StructuredContent, "%s", b)
	return string(b), rpc.Result.IsError, rpc.Result.StructuredContent
}
