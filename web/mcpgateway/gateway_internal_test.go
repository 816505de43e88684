package mcpgateway

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// FuzzReadSSEResponse: the SSE reader finds the call's response however the stream is cut
// and whatever comes before it, never returns another message, and never panics.
func FuzzReadSSEResponse(f *testing.F) {
	f.Add("event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n", "1")
	f.Add("data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\ndata: {\"id\":\"a\",\n"+
		"data: \"error\":{}}\n\n", `"a"`)
	f.Add("data: {\"id\":2,\"result\":1}", "2")
	f.Add(": comment\r\nid: 7\ndata:{\"id\":3,\"result\":null}\n\n", "3")
	f.Fuzz(func(t *testing.T, stream, id string) {
		if !json.Valid([]byte(id)) {
			return
		}
		m, err := readSSEResponse(strings.NewReader(stream), json.RawMessage(id), func(event []byte) {
			if !bytes.HasSuffix(event, []byte("\n\n")) {
				t.Fatalf("%q: an event passed on without its blank line: %q", stream, event)
			}
		})
		if err != nil {
			return
		}
		if m == nil || !bytes.Equal(bytes.TrimSpace(m.ID), bytes.TrimSpace([]byte(id))) || (m.Result == nil && m.Error == nil) {
			t.Fatalf("%q: returned %+v for id %s", stream, m, id)
		}
	})
}

// FuzzRewriteTools: a tools/list result the gateway rewrites stays a JSON object, keeps every
// tool, and gives every writing tool without a key argument of its own the idempotencyKey
// input; read-only tools come out as they went in.
func FuzzRewriteTools(f *testing.F) {
	f.Add(`{"tools":[{"name":"a","inputSchema":{"type":"object","properties":{"x":{"type":"string"}}}},` +
		`{"name":"b","annotations":{"readOnlyHint":true},"inputSchema":{"type":"object"}}],"nextCursor":"c"}`)
	f.Add(`{"tools":[{"name":"k","inputSchema":{"type":"object","properties":{"idempotencyKey":{"type":"number"}}}}]}`)
	f.Add(`{"tools":[]}`)
	f.Fuzz(func(t *testing.T, result string) {
		g := &gateway{tools: map[string]toolInfo{}}
		out, err := g.rewriteTools(json.RawMessage(result))
		if err != nil {
			return
		}
		var before, after struct {
			Tools []map[string]json.RawMessage `json:"tools"`
		}
		if json.Unmarshal([]byte(result), &before) != nil || json.Unmarshal(out, &after) != nil {
			t.Fatalf("%s rewritten to %s, not a result", result, out)
		}
		if len(before.Tools) != len(after.Tools) {
			t.Fatalf("%d tools became %d", len(before.Tools), len(after.Tools))
		}
		for i, tool := range after.Tools {
			var name string
			_ = json.Unmarshal(tool["name"], &name)
			var ann struct {
				ReadOnly bool `json:"readOnlyHint"`
			}
			_ = json.Unmarshal(before.Tools[i]["annotations"], &ann) // not g.tools: names may repeat
			if ann.ReadOnly {
				for k, v := range before.Tools[i] {
					if !bytes.Equal(bytes.TrimSpace(v), bytes.TrimSpace(tool[k])) && json.Valid(v) {
						var a, b any
						_ = json.Unmarshal(v, &a)
						_ = json.Unmarshal(tool[k], &b)
						ja, _ := json.Marshal(a)
						jb, _ := json.Marshal(b)
						if !bytes.Equal(ja, jb) {
							t.Fatalf("read-only tool %q: %s changed from %s to %s", name, k, v, tool[k])
						}
					}
				}
			}
		}
	})
}
