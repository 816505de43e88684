package web

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// batchOf is the body of POST /v1/acquire:batch with raw items.
func batchOf(items ...string) string {
	return `{"items":[` + strings.Join(items, ",") + `]}`
}

// batchResults decodes a 200 batch answer into its results.
func batchResults(t *testing.T, res apiResult) []map[string]any {
	t.Helper()
	require.Equal(t, http.StatusOK, res.status, res.raw)
	var body struct {
		Results []map[string]any `json:"results"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.raw), &body))
	return body.Results
}

// overConn sends a request with a body the HTTP server refuses by its size (413 before routing)
// over a real connection to s, since app.Test returns an error instead of the answer for it;
// the exchange is checked against openapi.json like apiClient.do's. s serves on a listener of
// its own from the first call on, until the test ends.
func overConn(c *apiClient, path, body string) apiResult {
	t := c.t
	t.Helper()
	addr, ok := serving[c.s]
	if !ok {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		go func() { _ = c.s.Serve(ln) }()
		t.Cleanup(func() { _ = c.s.Shutdown(context.Background()); delete(serving, c.s) })
		addr = ln.Addr().String()
		serving[c.s] = addr
	}
	header := http.Header{"Content-Type": {"application/json"}, "Authorization": {"Bearer " + c.key}}
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	// The server answers 413 and closes as soon as it has read the headers; the body is written
	// alongside reading the answer, and a write cut off by the close is expected.
	go func() {
		_, _ = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: idemgate\r\nContent-Type: application/json\r\n"+
			"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s", path, c.key, len(body), body)
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	res := apiResult{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	_ = json.Unmarshal(raw, &res.body)
	checkContract(t, exchange{method: "POST", target: path, header: header, body: []byte(body),
		status: resp.StatusCode, respHeader: resp.Header, respBody: raw})
	return res
}

// serving is the address each server of overConn listens on (tests using it are not parallel).
var serving = map[*Server]string{}

// normalizer makes two answers of the same sequence comparable across tenants: operation ids
// become their order of first appearance (so "the same operation as item 1" still shows), and
// what is new on every call (owner tokens, times, request ids) a placeholder.
type normalizer map[string]string

func (n normalizer) value(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, e := range x {
			switch k {
			case "operation_id", "id":
				if s, ok := e.(string); ok {
					if _, seen := n[s]; !seen {
						n[s] = fmt.Sprintf("op#%d", len(n)+1)
					}
					out[k] = n[s]
					continue
				}
			case "owner_token", "expires_at", "acquired_at", "request_id", "lease_expires_at":
				if e != nil {
					out[k] = "<" + k + ">"
					continue
				}
			}
			out[k] = n.value(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = n.value(e)
		}
		return out
	}
	return v
}

// TestAcquireBatchAnswersAsSingleAcquires: a sequence of acquire bodies sent one by one to
// POST /v1/acquire in one tenant, and as one batch in another, gets the same answers item by
// item: the status, and the body or problem document (ids, tokens and times compared by
// identity, not value). The sequence has an admission, its duplicate, a conflict, repeats of
// the first item's attempt_id within the batch, duplicates of an earlier item of the same batch, and items the single endpoint refuses
// for their body: invalid fields, wrong types, unknown and repeated members, a lone surrogate,
// a missing member, items that are not JSON objects, and one over the single endpoint's limit.
func TestAcquireBatchAnswersAsSingleAcquires(t *testing.T) {
	eachServer(t, func(t *testing.T, s *Server) {
		big := `{"key":"big","ttl_seconds":60,"correlation_id":"` + strings.Repeat("c", services.MaxBodyBytes) + `"}`
		items := []string{
			`{"key":"a","ttl_seconds":60,"operation":"charge","fingerprint":"f1","attempt_id":"att-1","metadata":{"x":1}}`,
			`{"key":"a","ttl_seconds":60,"operation":"charge","fingerprint":"f1"}`,
			`{"key":"a","ttl_seconds":60,"operation":"charge","fingerprint":"f2"}`,
			`{"key":"a","ttl_seconds":60,"operation":"charge","fingerprint":"f1","attempt_id":"att-1"}`,
			`{"key":"","ttl_seconds":0}`,
			`42`,
			`null`,
			`"a string"`,
			`[{"key":"b","ttl_seconds":60}]`,
			`{"key":"b","ttl_seconds":"60"}`,
			`{"key":"b","ttl_seconds":60,"extra":1}`,
			`{"key":"b","key":"c","ttl_seconds":60}`,
			`{"key":"b\ud800","ttl_seconds":60}`,
			`{"key":"b"}`,
			`{}`,
			big,
			`{"key":"b","ttl_seconds":60,"metadata":null,"operation":null}`,
			`{"key":"b","ttl_seconds":60}`,
			`{"key":"b","ttl_seconds":60,"attempt_id":"att-2"}`,
			`{"key":"a","ttl_seconds":60,"operation":"charge","fingerprint":"f1","attempt_id":"att-1"}`,
		}
		single, batch := newTenantClient(t, s), newTenantClient(t, s)
		want := make([]map[string]any, len(items))
		ns := normalizer{}
		// One difference is documented (docs/reference.md §9, issue 28): an item that repeats
		// an earlier item's key and attempt_id is no retry of a lost answer (that answer is in
		// the same response); it is decided and logged as the same request without its
		// attempt_id. The single endpoint is sent that request.
		asSingle := map[int]string{
			3:  `{"key":"a","ttl_seconds":60,"operation":"charge","fingerprint":"f1"}`,
			19: `{"key":"a","ttl_seconds":60,"operation":"charge","fingerprint":"f1"}`,
		}
		for i, item := range items {
			if body, ok := asSingle[i]; ok {
				item = body
			}
			send := single.do
			if len(item) > services.MaxBodyBytes {
				send = func(_, path string, body any) apiResult { return overConn(single, path, body.(string)) }
			}
			res := send("POST", "/v1/acquire", item)
			var body map[string]any
			require.NoError(t, json.Unmarshal([]byte(res.raw), &body), res.raw)
			member := "body"
			if res.status >= 400 {
				member = "problem"
			}
			want[i] = map[string]any{"status": float64(res.status), member: ns.value(body)}
		}
		got := batchResults(t, batch.do("POST", "/v1/acquire:batch", batchOf(items...)))
		require.Len(t, got, len(items))
		nb := normalizer{}
		for i := range items {
			require.Equal(t, want[i], nb.value(got[i]), "item %d: %.200s", i, items[i])
		}
		// The sequence covers what it says it does.
		statuses := map[float64]int{}
		for _, w := range want {
			statuses[w["status"].(float64)]++
		}
		require.Equal(t, map[float64]int{201: 2, 200: 5, 422: 1, 400: 11, 413: 1}, statuses)
		// Every valid item was logged as an attempt, with the result the single acquire got, in
		// item order for each key. (Across keys the log may differ in order: a batch admits the
		// first items of new keys together, before the other items.)
		logged := func(c *apiClient) map[string][]string {
			res := c.do("GET", "/v1/attempts?limit=100", nil)
			require.Equal(t, http.StatusOK, res.status, res.raw)
			out := map[string][]string{}
			n := 0
			for _, a := range res.body["items"].([]any) {
				a := a.(map[string]any)
				k := fmt.Sprint(a["key"])
				out[k] = append(out[k], fmt.Sprint(a["result"], " ", a["attempt_id"], " ", a["fingerprint"]))
				n++
			}
			require.Equal(t, 8, n)
			return out
		}
		singles := logged(single)
		require.Equal(t, singles, logged(batch))
	})
}

// TestAcquireBatchEnvelopeRefused: a request whose envelope is wrong is refused as a whole with
// one problem document, and decides nothing.
func TestAcquireBatchEnvelopeRefused(t *testing.T) {
	eachServer(t, func(t *testing.T, s *Server) {
		c := newTenantClient(t, s)
		item := `{"key":"env","ttl_seconds":60}`
		many := func(n int) string {
			items := make([]string, n)
			for i := range items {
				items[i] = fmt.Sprintf(`{"key":"env-%d","ttl_seconds":60}`, i)
			}
			return batchOf(items...)
		}
		for _, tc := range []struct {
			name, body string
			fields     []string
		}{
			{"empty body", ``, nil},
			{"not JSON", `{"items":[` + item, nil},
			{"an array", `[` + item + `]`, nil},
			{"a single acquire", item, []string{"key"}},
			{"no items", `{}`, []string{"items"}},
			{"items null", `{"items":null}`, []string{"items"}},
			{"items an object", `{"items":` + item + `}`, []string{"items"}},
			{"items a string", `{"items":"x"}`, []string{"items"}},
			{"no item", `{"items":[]}`, []string{"items"}},
			{"501 items", many(services.MaxBatchItems + 1), []string{"items"}},
			{"unknown member", `{"items":[` + item + `],"atomic":true}`, []string{"atomic"}},
			{"items twice", `{"items":[` + item + `],"items":[` + item + `]}`, []string{"items"}},
			{"Items", `{"Items":[` + item + `]}`, []string{"Items"}},
			{"trailing data", batchOf(item) + `{}`, nil},
			{"invalid UTF-8", "{\"items\":[{\"key\":\"\xff\",\"ttl_seconds\":60}]}", nil},
		} {
			res := problemOf(t, c.do("POST", "/v1/acquire:batch", tc.body), http.StatusBadRequest, services.CodeInvalidRequest)
			require.Equal(t, tc.fields, fieldNames(res), "%s: %s", tc.name, res.raw)
		}
		res := c.do("GET", "/v1/attempts", nil)
		require.Equal(t, http.StatusOK, res.status, res.raw)
		require.Empty(t, res.body["items"], "a refused batch decides nothing")
		// Only POST: the path exists, other methods are 405.
		require.Equal(t, http.StatusMethodNotAllowed, c.do("GET", "/v1/acquire:batch", nil).status)
		// Without an API key: 401 like every /v1 route.
		anon := &apiClient{t: t, s: s}
		problemOf(t, anon.do("POST", "/v1/acquire:batch", batchOf(item)), http.StatusUnauthorized, services.CodeUnauthorized)
	})
}

// paddedBatch is a batch of n valid items of about itemBytes each (the padding in metadata,
// within its 16 KiB limit).
func paddedBatch(prefix string, n, itemBytes int) string {
	items := make([]string, n)
	for i := range items {
		head := fmt.Sprintf(`{"key":"%s-%d","ttl_seconds":60,"metadata":{"pad":"`, prefix, i)
		items[i] = head + strings.Repeat("p", max(0, itemBytes-len(head)-3)) + `"}}`
	}
	return batchOf(items...)
}

// TestAcquireBatchLimits: 500 items are decided, 501 refused; the batch's body limit is 2 MiB,
// above the single endpoint's 256 KiB, which stays as it is.
func TestAcquireBatchLimits(t *testing.T) {
	dbs.Each(t, func(t *testing.T, db *models.DB) { testAcquireBatchLimits(t, db) })
}

func testAcquireBatchLimits(t *testing.T, db *models.DB) {
	{
		s := newTestServer(t, db)
		c := newTenantClient(t, s)
		// 500 items, about 1.5 MiB: over the single endpoint's limit, under the batch's.
		body := paddedBatch("max", services.MaxBatchItems, 3<<10)
		require.Greater(t, len(body), 1<<20)
		require.Less(t, len(body), MaxBatchBodyBytes)
		got := batchResults(t, c.do("POST", "/v1/acquire:batch", body))
		require.Len(t, got, services.MaxBatchItems)
		for i, r := range got {
			require.EqualValues(t, http.StatusCreated, r["status"], "item %d", i)
			require.Equal(t, fmt.Sprintf("max-%d", i), r["body"].(map[string]any)["key"], "results are in item order")
		}
		// The same bytes on the single endpoint: over its limit.
		problemOf(t, overConn(c, "/v1/acquire", body), http.StatusRequestEntityTooLarge, services.CodePayloadTooLarge)

		// Over 2 MiB: 413 for the whole request, naming the batch's limit; nothing decided.
		body = paddedBatch("over", services.MaxBatchItems, 4500)
		require.Greater(t, len(body), MaxBatchBodyBytes)
		res := problemOf(t, overConn(c, "/v1/acquire:batch", body), http.StatusRequestEntityTooLarge, services.CodePayloadTooLarge)
		require.Contains(t, res.body["detail"], "2 MiB")
		res = c.do("GET", "/v1/keys?prefix=over-", nil)
		require.Equal(t, http.StatusOK, res.status, res.raw)
		require.Empty(t, res.body["items"])

		// Refused from its Content-Length alone, before the body is read, like the single
		// endpoint's (the body is never sent). A body between the two limits is read, not
		// refused early: the connection would wait for it.
		status, _, raw := postOversized(t, newTestServer(t, db), "/v1/acquire:batch", MaxBatchBodyBytes+1)
		require.Equal(t, http.StatusRequestEntityTooLarge, status, raw)
		require.Contains(t, raw, "2 MiB")
	}
}

// TestBodyLimitFor: the batch's limit applies to exactly the paths the router sends to the batch
// handler (it matches case-insensitively, with or without a trailing slash).
func TestBodyLimitFor(t *testing.T) {
	for path, want := range map[string]int{
		"/v1/acquire:batch":         MaxBatchBodyBytes,
		"/v1/acquire:batch?x=1":     MaxBatchBodyBytes,
		"/V1/Acquire:Batch/":        MaxBatchBodyBytes,
		"/v1/acquire":               services.MaxBodyBytes,
		"/v1/acquire:batchx":        services.MaxBodyBytes,
		"/v1/acquire%3Abatch":       services.MaxBodyBytes, // not routed to the batch (404)
		"/v1/acquire:batch/x":       services.MaxBodyBytes,
		"/v1/release":               services.MaxBodyBytes,
		"/x/v1/acquire:batch":       services.MaxBodyBytes,
		"/v1/operations/x/outcome":  services.MaxBodyBytes,
		"":                          services.MaxBodyBytes,
		"/":                         services.MaxBodyBytes,
		"/v1/acquire:batch//":       services.MaxBodyBytes,
		"/v1/acquire:batch?a=/v1/x": MaxBatchBodyBytes,
	} {
		require.Equal(t, want, bodyLimitFor([]byte(path)), path)
	}
}

// FuzzDecodeBatch checks the batch envelope's decoder two ways. As an envelope, any body is
// either refused as invalid_request or gives 1 to MaxBatchItems items that are exactly the
// elements of the body's "items" array, and each item is either decoded or refused as
// invalid_request. As an item, any body wrapped in an envelope is decoded or refused exactly as
// POST /v1/acquire decodes or refuses it alone (the same input, or the same error).
func FuzzDecodeBatch(f *testing.F) {
	for _, s := range []string{`{"key":"a","ttl_seconds":60}`, `{"items":[{"key":"a","ttl_seconds":60}]}`,
		`{"items":[1,null,"x",[],{}]}`, `{"items":[]}`, `{"items":null}`, `{"items":{}}`, `{"items":[{"key":"a\ud800"}]}`,
		`{"items":[{"key":"a"}],"items":[]}`, `{"Items":[{}]}`, `{"items":[{"key":"a","ttl_seconds":"1"}]} {}`,
		` {"metadata":{"x":[1,{"y":null}]},"key":"k","ttl_seconds":1} `, `{"key":"b","key":"c"}`, "\xff", `{`, `[`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		isInvalid := func(err error) {
			t.Helper()
			var de *services.Error
			if !errors.As(err, &de) || de.Code != services.CodeInvalidRequest {
				t.Fatalf("error is not invalid_request: %v", err)
			}
		}
		// As an envelope.
		items, err := decodeBatch(body)
		if err != nil {
			isInvalid(err)
		} else {
			if len(items) < 1 || len(items) > services.MaxBatchItems {
				t.Fatalf("accepted %d items", len(items))
			}
			var generic struct{ Items []any }
			if json.Unmarshal(body, &generic) != nil || len(generic.Items) != len(items) {
				t.Fatalf("items %d do not match the body %q", len(items), body)
			}
			for i, raw := range items {
				if !json.Valid(raw) {
					t.Fatalf("item %d is not one JSON value: %q", i, raw)
				}
				if _, err := decodeAcquire(raw); err != nil {
					isInvalid(err)
				}
			}
		}
		// As an item: the same answer as the single endpoint's decoder.
		wrapped, err := decodeBatch([]byte(`{"items":[` + string(body) + `]}`))
		if err != nil || len(wrapped) != 1 {
			return // not one JSON value of valid UTF-8: the envelope is refused, not the item
		}
		in, err := decodeAcquire(wrapped[0])
		want, wantErr := decodeAcquire(body)
		if !reflect.DeepEqual(err, wantErr) || !reflect.DeepEqual(in, want) {
			t.Fatalf("item %q: batch decoded (%+v, %v), single (%+v, %v)", body, in, err, want, wantErr)
		}
	})
}
