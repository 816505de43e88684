package mcpgateway_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testkit"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/idemgate/idemgate/web/internal/servertest"
	"github.com/idemgate/idemgate/web/mcpgateway"
	"github.com/stretchr/testify/require"
)

var dbs *modeltest.Set

func TestMain(m *testing.M) { os.Exit(modeltest.Run(m, &dbs)) }

// startUpstream runs testdata/upstream.mjs, an MCP server written with the reference
// TypeScript SDK, and returns its base URL.
func startUpstream(t *testing.T, dropRate float64, mode string) string {
	t.Helper()
	port := testkit.StartNode(t, testkit.NodeScript(t, "testdata/upstream.mjs"), fmt.Sprint(dropRate), mode, "7")
	return "http://127.0.0.1:" + port
}

// startGateway serves a gateway in front of upstream through srv's idemgate until the test ends.
func startGateway(t *testing.T, srv *servertest.Server, cfg mcpgateway.Config) string {
	t.Helper()
	cfg.Client = servertest.NewClient(t, srv)
	app, err := mcpgateway.New(cfg)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = app.Listener(ln) }()
	t.Cleanup(func() { _ = app.ShutdownWithTimeout(5 * time.Second) })
	return "http://" + ln.Addr().String() + "/mcp"
}

type upstreamState struct {
	Effects map[string]int `json:"effects"`
	Dropped []string       `json:"dropped"`
}

func readUpstream(t *testing.T, upstream string) upstreamState {
	t.Helper()
	resp, err := http.Get(upstream + "/effects")
	require.NoError(t, err)
	defer resp.Body.Close()
	var s upstreamState
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&s))
	return s
}

// rpc POSTs one JSON-RPC request to url and returns the response message's result (or error).
func rpc(t *testing.T, url, method string, params any) (result map[string]any, rpcErr map[string]any) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	req, err := http.NewRequest("POST", url, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode, "%s", raw)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		for _, line := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(line, "data: "); ok {
				raw = []byte(v)
			}
		}
	}
	var m struct {
		Result map[string]any `json:"result"`
		Error  map[string]any `json:"error"`
	}
	require.NoError(t, json.Unmarshal(raw, &m), "%s", raw)
	return m.Result, m.Error
}

// post POSTs body to url with the MCP headers (and extra) and returns the answer's body,
// whatever its status.
func post(t *testing.T, url, body string, extra map[string]string) []byte {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range extra {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return raw
}

// lastMessage is the JSON-RPC message of an answer: the whole body, or the last event's data
// of an event stream.
func lastMessage(raw []byte) []byte {
	if !bytes.HasPrefix(bytes.TrimSpace(raw), []byte("event:")) && !bytes.HasPrefix(bytes.TrimSpace(raw), []byte("data:")) {
		return raw
	}
	var last []byte
	for _, line := range bytes.Split(raw, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
			last = v
		}
	}
	return last
}

func call(t *testing.T, url, tool string, args map[string]any, meta map[string]any) map[string]any {
	t.Helper()
	params := map[string]any{"name": tool, "arguments": args}
	if meta != nil {
		params["_meta"] = meta
	}
	res, rpcErr := rpc(t, url, "tools/call", params)
	require.Nil(t, rpcErr)
	return res
}

// code is the code of a gateway's tool error, from _meta["io.idemgate/error"]; a tool without an
// output schema also has it as structuredContent, the same.
func code(res map[string]any) string {
	meta, _ := res["_meta"].(map[string]any)
	detail, _ := meta[mcpgateway.MetaError].(map[string]any)
	c, _ := detail["code"].(string)
	if sc, ok := res["structuredContent"].(map[string]any); ok && res["isError"] == true {
		if sc["code"] != c {
			panic(fmt.Sprintf("structuredContent %v and _meta %v disagree", sc, detail))
		}
	}
	return c
}

// TestGatewaySemantics walks docs/reference.md §13's rules one by one, against an MCP server
// written with the TypeScript SDK, in both of its answer modes.
func TestGatewaySemantics(t *testing.T) {
	srv := servertest.Start(t, dbs.Postgres)
	for _, mode := range []string{"json", "sse"} {
		t.Run(mode, func(t *testing.T) {
			upstream := startUpstream(t, 0, mode)
			gw := startGateway(t, srv, mcpgateway.Config{Upstream: upstream + "/mcp", UpstreamTimeout: 10 * time.Second,
				TTL: time.Hour, Wait: 5 * time.Second})

			// tools/list: the writing tool takes the key, the read-only one is unchanged.
			list, rpcErr := rpc(t, gw, "tools/list", map[string]any{})
			require.Nil(t, rpcErr)
			tools := map[string]map[string]any{}
			for _, x := range list["tools"].([]any) {
				tool := x.(map[string]any)
				tools[tool["name"].(string)] = tool
			}
			props := func(name string) map[string]any {
				return tools[name]["inputSchema"].(map[string]any)["properties"].(map[string]any)
			}
			require.Contains(t, props("send_email"), mcpgateway.KeyArgument)
			require.Contains(t, tools["send_email"]["description"], "idempotencyKey")
			require.NotContains(t, props("count_sent"), mcpgateway.KeyArgument)
			require.Equal(t, "How many e-mails were sent to an address.", tools["count_sent"]["description"])

			to := "sem-" + mode + "@example.com"
			first := call(t, gw, "send_email", map[string]any{"to": to, "subject": "hi", "idempotencyKey": "k1-" + mode}, nil)
			require.Nil(t, first["isError"], "%v", first)
			again := call(t, gw, "send_email", map[string]any{"subject": "hi", "to": to, "idempotencyKey": "k1-" + mode}, nil)
			require.Equal(t, first["structuredContent"], again["structuredContent"], "the first result, replayed")
			require.Equal(t, true, again["_meta"].(map[string]any)[mcpgateway.MetaReplayed])
			viaMeta := call(t, gw, "send_email", map[string]any{"to": to, "subject": "hi"},
				map[string]any{mcpgateway.MetaKey: "k1-" + mode})
			require.Equal(t, first["structuredContent"], viaMeta["structuredContent"], "the key in _meta is the same key")
			require.Equal(t, 1, readUpstream(t, upstream).Effects[to])

			other := call(t, gw, "send_email", map[string]any{"to": to, "subject": "other", "idempotencyKey": "k1-" + mode}, nil)
			require.Equal(t, true, other["isError"])
			require.Equal(t, mcpgateway.CodeFingerprintMismatch, code(other))
			require.Nil(t, other["structuredContent"], "send_email declares an output schema an error would not match")

			// Read-only tools and calls without a key pass through: twice is twice.
			ro := call(t, gw, "count_sent", map[string]any{"to": to}, nil)
			require.Equal(t, "1", ro["content"].([]any)[0].(map[string]any)["text"])
			bare := "bare-" + mode + "@example.com"
			call(t, gw, "send_email", map[string]any{"to": bare, "subject": "hi"}, nil)
			call(t, gw, "send_email", map[string]any{"to": bare, "subject": "hi"}, nil)
			require.Equal(t, 2, readUpstream(t, upstream).Effects[bare], "unguarded without a key")

			// An unknown tool and arguments the tool refuses: the TypeScript SDK answers both as
			// tool errors (isError), not JSON-RPC errors. The key is released, so the repeat
			// and the corrected call run; nothing is replayed. Before, such an error was
			// recorded as the outcome: the repeat got it replayed, and the corrected call with
			// the same key fingerprint_mismatch for the whole TTL.
			for range 2 {
				res, rpcErr := rpc(t, gw, "tools/call", map[string]any{"name": "no_such_tool", "arguments": map[string]any{},
					"_meta": map[string]any{mcpgateway.MetaKey: "k-unknown-" + mode}})
				require.True(t, rpcErr != nil || res["isError"] == true, "%v %v", res, rpcErr)
				if res != nil {
					require.Nil(t, res["_meta"], "the upstream's own error, not a replay")
				}
			}
			fixed := "fixed-" + mode + "@example.com"
			refused := call(t, gw, "send_email", map[string]any{"to": fixed, "subject": 7, "idempotencyKey": "k-fix-" + mode}, nil)
			require.Equal(t, true, refused["isError"], "%v", refused)
			require.Empty(t, code(refused), "the tool's error, passed on")
			ran := call(t, gw, "send_email", map[string]any{"to": fixed, "subject": "hi", "idempotencyKey": "k-fix-" + mode}, nil)
			require.Nil(t, ran["isError"], "the corrected call runs: %v", ran)
			require.Equal(t, 1, readUpstream(t, upstream).Effects[fixed])

			// A tool with an idempotencyKey of its own: the key is used, and forwarded.
			room := "room-" + mode
			for range 2 {
				b := call(t, gw, "book", map[string]any{"room": room, "idempotencyKey": "k-book-" + mode}, nil)
				require.Contains(t, b["content"].([]any)[0].(map[string]any)["text"], "key=k-book-"+mode)
			}
			require.Equal(t, 1, readUpstream(t, upstream).Effects[room], "its own key guards it too")

			// Ids the upstream may write back in another form (1.0 as 1): the caller gets its
			// own id, and the call its result, not "outcome unknown".
			for i, id := range []string{"1.0", `"\u0061"`, "1e2"} {
				body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"method":"tools/call","params":{"name":"send_email",`+
					`"arguments":{"to":"id-%s-%d","subject":"hi","idempotencyKey":"k-id-%s-%d"}}}`, id, mode, i, mode, i)
				raw := lastMessage(post(t, gw, body, nil))
				var m map[string]json.RawMessage
				require.NoError(t, json.Unmarshal(raw, &m), "%s", raw)
				require.Equal(t, id, string(m["id"]), "%s", raw)
				require.NotContains(t, string(m["result"]), mcpgateway.CodeOutcomeUncertain, "%s", raw)
			}

			// A batch holding a tools/call would pass unguarded: refused. A compressed body
			// (inflated without a bound by c.Body()) is refused.
			batch := `[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"send_email","arguments":` +
				`{"to":"batch-` + mode + `","subject":"s","idempotencyKey":"kb"}}}]`
			require.Contains(t, string(post(t, gw, batch, nil)), "batch")
			require.Contains(t, string(post(t, gw, batch, map[string]string{"Content-Encoding": "gzip"})), "compressed")
			require.Zero(t, readUpstream(t, upstream).Effects["batch-"+mode])

			// Member names matched exactly: "NAME" is not "name" to a JavaScript upstream, so a
			// read-only NAME must not let the send_email through unguarded.
			sneaky := `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"send_email","NAME":"count_sent",` +
				`"arguments":{"to":"case-` + mode + `","subject":"s","idempotencyKey":"k-case-` + mode + `"}}}`
			post(t, gw, sneaky, nil)
			post(t, gw, sneaky, nil)
			require.Equal(t, 1, readUpstream(t, upstream).Effects["case-"+mode])

			// What the gateway cannot read is never passed on: a byte order mark (JavaScript
			// skips it, Go's reader refused it, and the call went through unguarded, twice).
			bom := "\xEF\xBB\xBF" + `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"send_email",` +
				`"arguments":{"to":"bom-` + mode + `","subject":"s","idempotencyKey":"k-bom-` + mode + `"}}}`
			post(t, gw, bom, nil)
			post(t, gw, bom, nil)
			require.Equal(t, 1, readUpstream(t, upstream).Effects["bom-"+mode])
			deep := `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"send_email","arguments":{"to":"deep-` +
				mode + `","subject":"s","idempotencyKey":"k-deep","x":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}}}`
			require.Contains(t, string(post(t, gw, deep, nil)), "-32700")
			require.Zero(t, readUpstream(t, upstream).Effects["deep-"+mode])

			// The io.idemgate/* _meta members are the gateway's: a client's never reach the upstream.
			spoof := call(t, gw, "book", map[string]any{"room": "spoof-" + mode},
				map[string]any{mcpgateway.MetaFencingToken: 999999, mcpgateway.MetaPrevious: map[string]any{"id": "fake"}})
			require.NotContains(t, spoof["content"].([]any)[0].(map[string]any)["text"], "999999")
			require.NotContains(t, spoof["content"].([]any)[0].(map[string]any)["text"], "fake")

			// Keys that differ only in lone surrogates are refused, not merged into U+FFFD.
			for _, k := range []string{`"\ud800"`, `"\udc00"`} {
				raw := post(t, gw, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"send_email",`+
					`"arguments":{"to":"sur-`+mode+`","subject":"s"},"_meta":{"io.idemgate/key":`+k+`}}}`, nil)
				require.Contains(t, string(raw), mcpgateway.CodeKeyInvalid, "%s", raw)
			}

			// A key that is not a string.
			bad := call(t, gw, "send_email", map[string]any{"to": to, "subject": "hi", "idempotencyKey": 7}, nil)
			require.Equal(t, mcpgateway.CodeKeyInvalid, code(bad))
		})
	}
}

// TestGatewayLostAnswerIsUncertain: a call whose answer the upstream dropped after its effect
// is reported as "outcome unknown" and never forwarded again; the key's operation is
// uncertain at idemgate; with RequireKey a call without a key is refused.
func TestGatewayLostAnswerIsUncertain(t *testing.T) {
	srv := servertest.Start(t, dbs.Postgres)
	upstream := startUpstream(t, 1, "sse") // every send_email answer is dropped
	gw := startGateway(t, srv, mcpgateway.Config{Upstream: upstream + "/mcp", UpstreamTimeout: 10 * time.Second,
		TTL: time.Hour, RequireKey: true})
	args := map[string]any{"to": "lost@example.com", "subject": "hi", "idempotencyKey": "k-lost"}
	for range 3 {
		res := call(t, gw, "send_email", args, nil)
		require.Equal(t, true, res["isError"])
		require.Equal(t, mcpgateway.CodeOutcomeUncertain, code(res))
		require.Contains(t, res["content"].([]any)[0].(map[string]any)["text"], "verify before retrying")
	}
	require.Equal(t, 1, readUpstream(t, upstream).Effects["lost@example.com"], "forwarded once")
	var state string
	require.NoError(t, srv.DB.Raw("SELECT state FROM operations WHERE key = 'mcp|k-lost'").Scan(&state).Error)
	require.Equal(t, "uncertain", state)

	// Reconciled failed by an operator: the key is still held, and repeats are told so, not
	// "result unavailable" (before) as if the call had taken effect.
	var opID string
	require.NoError(t, srv.DB.Raw("SELECT id FROM operations WHERE key = 'mcp|k-lost'").Scan(&opID).Error)
	body, _ := json.Marshal(map[string]any{"job_id": "recon-k-lost", "status": "failed", "note": "not sent, per the mail log",
		"operation_ids": []string{opID}})
	req, err := http.NewRequest("POST", srv.URL+"/v1/reconciliations", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+srv.APIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Less(t, resp.StatusCode, 300, "%s", raw)
	failed := call(t, gw, "send_email", args, nil)
	require.Equal(t, mcpgateway.CodeOperationFailed, code(failed))
	require.Equal(t, 1, readUpstream(t, upstream).Effects["lost@example.com"])

	missing := call(t, gw, "send_email", map[string]any{"to": "x@example.com", "subject": "hi"}, nil)
	require.Equal(t, mcpgateway.CodeKeyMissing, code(missing))
	require.Zero(t, readUpstream(t, upstream).Effects["x@example.com"])
}

type chaosRun struct {
	Results map[string]struct {
		Final     string `json:"final"`
		Replayed  bool   `json:"replayed"`
		MessageID string `json:"messageId"`
		Attempts  int    `json:"attempts"`
		To        string `json:"to"`
		LastError string `json:"lastError"`
	} `json:"results"`
	Latencies []float64 `json:"latencies_ms"`
}

func runAgent(t *testing.T, url string, n, concurrency int, abortRate float64, prefix string) chaosRun {
	t.Helper()
	script := testkit.NodeScript(t, "testdata/chaos_client.mjs")
	cmd := exec.Command("node", script, url, fmt.Sprint(n), fmt.Sprint(concurrency), fmt.Sprint(abortRate), prefix)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	require.NoError(t, err)
	var run chaosRun
	require.NoError(t, json.Unmarshal(out, &run))
	require.Len(t, run.Results, n)
	return run
}

// TestGatewayChaos is issue 33's test: 2,000 write-tool calls by the reference TypeScript
// client through the gateway, 20% of the upstream's answers dropped after the effect, 10% of
// the client's attempts aborted by the client, every failed attempt retried with the same key.
// No effect happens twice, and every call ends with its result (first or replayed) or an
// explicit "outcome unknown", which is exactly the calls whose answer was dropped.
func TestGatewayChaos(t *testing.T) {
	srv := servertest.Start(t, dbs.Postgres)
	upstream := startUpstream(t, 0.2, "sse")
	gw := startGateway(t, srv, mcpgateway.Config{Upstream: upstream + "/mcp", UpstreamTimeout: 20 * time.Second,
		TTL: time.Hour, Wait: 20 * time.Second})
	run := runAgent(t, gw, 2000, 16, 0.1, "chaos")
	st := readUpstream(t, upstream)

	dropped := map[string]bool{}
	for _, to := range st.Dropped {
		require.False(t, dropped[to], "%s: the upstream saw a second call", to)
		dropped[to] = true
	}
	var ok, replayed, unknown, retried int
	for key, r := range run.Results {
		require.LessOrEqual(t, st.Effects[r.To], 1, "%s: %d effects", key, st.Effects[r.To])
		switch r.Final {
		case "ok":
			ok++
			require.Equal(t, 1, st.Effects[r.To], "%s answered ok", key)
			require.False(t, dropped[r.To], "%s: its answer was dropped, yet it got a result", key)
			require.NotEmpty(t, r.MessageID)
		case "unknown":
			unknown++
			require.True(t, dropped[r.To], "%s: unknown, but its answer was not dropped", key)
		default:
			t.Fatalf("%s ended %q after %d attempts (last error %s)", key, r.Final, r.Attempts, r.LastError)
		}
		if r.Replayed {
			replayed++
		}
		if r.Attempts > 1 {
			retried++
		}
	}
	require.Equal(t, len(dropped), unknown, "every dropped answer ends as an explicit unknown")
	require.Positive(t, replayed, "retries after an abort got the first result replayed")
	t.Logf("2000 calls: %d ok (%d replayed), %d unknown (upstream dropped %d), %d retried", ok, replayed, unknown,
		len(dropped), retried)
}

// TestGatewayOverhead measures the gateway's cost per call in the same run: 400 calls by the
// TypeScript client straight to the upstream, then 400 through the gateway (each a new key: an
// acquire and an outcome at idemgate on the call's path). Figures only, no threshold.
func TestGatewayOverhead(t *testing.T) {
	srv := servertest.Start(t, dbs.Postgres)
	upstream := startUpstream(t, 0, "sse")
	gw := startGateway(t, srv, mcpgateway.Config{Upstream: upstream + "/mcp", TTL: time.Hour})
	direct := runAgent(t, upstream+"/mcp", 400, 4, 0, "direct")
	via := runAgent(t, gw, 400, 4, 0, "via")
	q := func(xs []float64, p float64) float64 {
		s := slices.Clone(xs)
		sort.Float64s(s)
		return s[int(p*float64(len(s)-1))]
	}
	for _, r := range via.Results {
		require.Equal(t, "ok", r.Final)
	}
	d50, d99, g50, g99 := q(direct.Latencies, .5), q(direct.Latencies, .99), q(via.Latencies, .5), q(via.Latencies, .99)
	t.Logf("per call, 4 concurrent agents: direct p50 %.1f ms p99 %.1f ms; through the gateway p50 %.1f ms p99 %.1f ms (+%.1f ms p99, %.2fx)",
		d50, d99, g50, g99, g99-d99, g99/d99)
}

// TestGatewayCallerScope: with CallerHeader, two callers' equal keys are two keys: the second
// caller's call runs instead of getting the first caller's result (found by a new user: without
// it, any caller with the key read another's result).
func TestGatewayCallerScope(t *testing.T) {
	srv := servertest.Start(t, dbs.Postgres)
	upstream := startUpstream(t, 0, "json")
	gw := startGateway(t, srv, mcpgateway.Config{Upstream: upstream + "/mcp", UpstreamTimeout: 10 * time.Second,
		TTL: time.Hour, CallerHeader: "Authorization"})
	send := func(auth string) map[string]any {
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{
			"name": "send_email", "arguments": map[string]any{"to": "scoped@example.com", "subject": "hi", "idempotencyKey": "same"}}})
		req, err := http.NewRequest("POST", gw, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", auth)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var m struct {
			Result map[string]any `json:"result"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&m))
		return m.Result
	}
	a := send("Bearer alice")
	require.Nil(t, a["isError"], "%v", a)
	b := send("Bearer bob")
	require.Nil(t, b["_meta"], "bob's call is not alice's replayed: %v", b)
	again := send("Bearer alice")
	require.Equal(t, true, again["_meta"].(map[string]any)[mcpgateway.MetaReplayed])
	require.Equal(t, 2, readUpstream(t, upstream).Effects["scoped@example.com"])
}

// TestGatewayToolAsksTheClient: a guarded call whose tool asks the client to confirm mid-call
// (elicitation/create, on the call's event stream) gets its answer and completes. Before, the
// gateway read the call's stream to its end before passing anything on: the question never
// reached the client, and the call ended "outcome unknown" at the upstream timeout though it
// had done nothing (found by a breaker).
func TestGatewayToolAsksTheClient(t *testing.T) {
	srv := servertest.Start(t, dbs.Postgres)
	upstream := startUpstream(t, 0, "stateful")
	gw := startGateway(t, srv, mcpgateway.Config{Upstream: upstream + "/mcp", UpstreamTimeout: 10 * time.Second,
		TTL: time.Hour})
	script := testkit.NodeScript(t, "testdata/elicit_client.mjs")
	cmd := exec.Command("node", script, gw, "k-confirm", "confirm@example.com")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	require.NoError(t, err)
	var run struct {
		First, Second map[string]any
		Asked         int
	}
	require.NoError(t, json.Unmarshal(out, &run), "%s", out)
	require.Nil(t, run.First["isError"], "%v", run.First)
	require.Contains(t, run.First["content"].([]any)[0].(map[string]any)["text"], "after confirmation")
	require.Equal(t, 1, run.Asked, "asked once: the repeat is a replay")
	require.Equal(t, true, run.Second["_meta"].(map[string]any)[mcpgateway.MetaReplayed])
	require.Equal(t, 1, readUpstream(t, upstream).Effects["confirm@example.com"])
}
