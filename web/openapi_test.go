package web

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	verrors "github.com/pb33f/libopenapi-validator/errors"
	"github.com/pb33f/libopenapi-validator/paths"
	"github.com/pb33f/libopenapi-validator/schema_validation"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"
	"github.com/stretchr/testify/require"
)

// The OpenAPI document (openapi.json) is checked against the server in two ways: every call
// the API tests make through apiClient.do is validated against it (contract.check), and the
// tests below check the document itself, its routes and its problem codes against the code.

// contract is the embedded OpenAPI document, loaded for validation.
type contract struct {
	// mu serialises validation: tests of this package run in parallel and one validator is
	// shared.
	mu        sync.Mutex
	validator validator.Validator
	model     *v3.Document
	schemas   schema_validation.SchemaValidator
}

// loadContract parses openAPIDocument once for the whole test binary.
var loadContract = sync.OnceValues(func() (*contract, error) {
	doc, err := libopenapi.NewDocument(openAPIDocument)
	if err != nil {
		return nil, fmt.Errorf("parse openapi.json: %w", err)
	}
	model, err := doc.BuildV3Model()
	if err != nil {
		return nil, fmt.Errorf("build the OpenAPI 3 model of openapi.json: %w", err)
	}
	// Format assertions: date-time and uuid are checked, not just annotations.
	v, errs := validator.NewValidator(doc, config.WithFormatAssertions())
	if len(errs) > 0 {
		return nil, fmt.Errorf("validator for openapi.json: %v", errs)
	}
	return &contract{validator: v, model: &model.Model,
		schemas: schema_validation.NewSchemaValidator(config.WithFormatAssertions())}, nil
})

func mustContract(t testing.TB) *contract {
	t.Helper()
	k, err := loadContract()
	require.NoError(t, err)
	return k
}

// exchange is one HTTP call as the client made and saw it.
type exchange struct {
	method     string
	target     string // path and query as sent, still percent-encoded
	header     http.Header
	body       []byte
	status     int
	respHeader http.Header
	respBody   []byte
}

func (x exchange) request() *http.Request {
	r := httptest.NewRequest(x.method, x.target, bytes.NewReader(x.body))
	for k, vs := range x.header {
		r.Header[k] = append([]string(nil), vs...)
	}
	return r
}

func (x exchange) response() *http.Response {
	return &http.Response{StatusCode: x.status, Header: x.respHeader, Body: io.NopCloser(bytes.NewReader(x.respBody))}
}

// refusalSchemas are the problem schemas of the answers the HTTP layer gives whatever the route
// (the document's info.description lists them), by status.
var refusalSchemas = map[int]string{
	http.StatusBadRequest:                  "InvalidRequestProblem",
	http.StatusUnauthorized:                "UnauthorizedProblem",
	http.StatusNotFound:                    "NotFoundProblem",
	http.StatusMethodNotAllowed:            "Problem", // and code invalid_request: checkRefusal
	http.StatusRequestEntityTooLarge:       "PayloadTooLargeProblem",
	http.StatusTooManyRequests:             "RateLimitedProblem",
	http.StatusRequestHeaderFieldsTooLarge: "HeaderFieldsTooLargeProblem",
	http.StatusInternalServerError:         "InternalProblem",
	http.StatusServiceUnavailable:          "StoreUnavailableProblem",
}

// check validates one exchange against the document and returns what does not match, or nil.
//
//   - A documented operation: the response must be one the operation documents (status,
//     content type, body schema, required headers). The request is validated too, but a request
//     the document refuses (a test sending malformed JSON on purpose, or no API key) only has to
//     be refused by the server: answering it with a success would mean the document is stricter
//     than the server.
//   - A documented path with another method, an unknown path under /v1, or any problem+json
//     answer elsewhere: the response must be one of the HTTP layer's documented refusals.
//   - Anything else (dashboard pages, static files) is not part of the JSON API.
func (k *contract) check(x exchange) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	path, _, _ := strings.Cut(x.target, "?")
	item, missing, _ := paths.FindPath(x.request(), k.model, nil)
	if item == nil || len(missing) > 0 {
		if item == nil && !strings.HasPrefix(path, "/v1/") && !isProblem(x.respHeader) {
			return nil
		}
		return k.checkRefusal(x)
	}
	var out []string
	if ok, errs := k.validator.ValidateHttpResponse(x.request(), x.response()); !ok {
		out = append(out, "response: "+describe(errs))
	}
	if ok, errs := k.validator.ValidateHttpRequestSync(x.request()); !ok && x.status < 400 && !batchRefusedAnItem(path, x.respBody) {
		out = append(out, fmt.Sprintf("the server answered %d to a request the document refuses: %s", x.status, describe(errs)))
	}
	return out
}

// batchRefusedAnItem reports whether body, the answer to a POST /v1/acquire:batch, refused an
// item with 400: the document types items as AcquireRequest and says an item that does not
// match is answered alone with 400 (a test sends such items on purpose), so that batch
// request is one the document refuses and the server refused in part, as documented.
func batchRefusedAnItem(path string, body []byte) bool {
	if path != "/v1/acquire:batch" {
		return false
	}
	var res struct {
		Results []struct {
			Status int `json:"status"`
		} `json:"results"`
	}
	if json.Unmarshal(body, &res) != nil {
		return false
	}
	for _, r := range res.Results {
		if r.Status == http.StatusBadRequest {
			return true
		}
	}
	return false
}

// checkRefusal checks a response of the HTTP layer outside the documented operations.
func (k *contract) checkRefusal(x exchange) []string {
	name, ok := refusalSchemas[x.status]
	if !ok {
		return []string{fmt.Sprintf("status %d is not a refusal the document describes for any route", x.status)}
	}
	if !isProblem(x.respHeader) {
		return []string{fmt.Sprintf("a %d refusal has Content-Type %q, not application/problem+json", x.status, x.respHeader.Get("Content-Type"))}
	}
	if x.status == http.StatusMethodNotAllowed {
		// OpenAPI lists only the methods a path has, so no operation names the 405 (a
		// component for it would be one no operation uses); info.description says it is
		// invalid_request, with no field errors.
		var p struct {
			Status int             `json:"status"`
			Code   string          `json:"code"`
			Errors json.RawMessage `json:"errors"`
		}
		if err := json.Unmarshal(x.respBody, &p); err != nil || p.Status != x.status || p.Code != "invalid_request" || p.Errors != nil {
			return []string{fmt.Sprintf("a 405 refusal is not an invalid_request problem without errors: %s", x.respBody)}
		}
	}
	return k.checkSchema(name, x.respBody)
}

// checkSchema validates body against the document's component schema name.
func (k *contract) checkSchema(name string, body []byte) []string {
	sp := k.model.Components.Schemas.GetOrZero(name)
	if sp == nil {
		return []string{"the document has no schema " + name}
	}
	if ok, errs := k.schemas.ValidateSchemaBytesWithVersion(sp.Schema(), body, 3.1); !ok {
		return []string{name + ": " + describe(errs)}
	}
	return nil
}

func isProblem(h http.Header) bool {
	mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	return mt == "application/problem+json"
}

// describe renders validation errors with the schema failures under them.
func describe(errs []*verrors.ValidationError) string {
	var b strings.Builder
	for _, e := range errs {
		fmt.Fprintf(&b, "\n  %s: %s", e.Message, e.Reason)
		for _, f := range e.SchemaValidationErrors {
			fmt.Fprintf(&b, "\n    at %s: %s", f.FieldPath, f.Reason)
		}
	}
	return b.String()
}

// checkContract fails the test if x does not match the OpenAPI document (contract.check).
func checkContract(t testing.TB, x exchange) {
	t.Helper()
	if problems := mustContract(t).check(x); len(problems) > 0 {
		t.Errorf("%s %s answered %d, which does not match openapi.json:\n%s\nresponse body: %s",
			x.method, x.target, x.status, strings.Join(problems, "\n"), truncate(x.respBody, 2000))
	}
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// TestOpenAPIDocumentIsValid: openapi.json is OpenAPI 3.1, valid against the specification's
// schema, with every $ref resolving.
func TestOpenAPIDocumentIsValid(t *testing.T) {
	t.Parallel()
	require.True(t, json.Valid(openAPIDocument), "openapi.json is not valid JSON")
	doc, err := libopenapi.NewDocument(openAPIDocument)
	require.NoError(t, err)
	info := doc.GetSpecInfo()
	require.Equal(t, "3.1.0", info.Version)
	_, err = doc.BuildV3Model()
	require.NoError(t, err, "every $ref must resolve")
	ok, errs := mustContract(t).validator.ValidateDocument()
	require.True(t, ok, "openapi.json is not a valid OpenAPI 3.1 document:%s", describe(errs))
	onDisk, err := os.ReadFile("openapi.json")
	require.NoError(t, err)
	require.Equal(t, string(onDisk), string(openAPIDocument), "the embedded document is the file")
}

// fiberParam is a Fiber route parameter (":id") or wildcard ("*").
var fiberParam = regexp.MustCompile(`:[A-Za-z_]+|\*`)

// openAPIPathOf turns a Fiber route pattern into OpenAPI's: ":id" becomes "{id}", and the
// wildcard takes the name of the one parameter the document declares in its place.
func openAPIPathOf(fiberPath string, documented map[string]bool) string {
	// An escaped colon (`\:`, as in /v1/acquire\:batch) is a literal one, not a parameter.
	const literalColon = "\x00"
	fiberPath = strings.ReplaceAll(fiberPath, `\:`, literalColon)
	p := fiberParam.ReplaceAllStringFunc(fiberPath, func(m string) string {
		if m == "*" {
			return "{*}"
		}
		return "{" + m[1:] + "}"
	})
	p = strings.ReplaceAll(p, literalColon, ":")
	if !strings.Contains(p, "{*}") {
		return p
	}
	prefix := p[:strings.Index(p, "{*}")]
	for d := range documented {
		rest, ok := strings.CutPrefix(d, prefix)
		if ok && strings.HasPrefix(rest, "{") && strings.HasSuffix(rest, "}") && !strings.Contains(rest, "/") {
			return d
		}
	}
	return p
}

// TestOpenAPIDocumentCoversEveryRoute: every JSON API route the server registers (/v1 and the
// operational endpoints) is in the document with its method, and the document names no
// operation the server does not have.
func TestOpenAPIDocumentCoversEveryRoute(t *testing.T) {
	t.Parallel()
	k := mustContract(t)
	documented := map[string]bool{} // "METHOD /path"
	documentedPaths := map[string]bool{}
	for path, item := range k.model.Paths.PathItems.FromOldest() {
		documentedPaths[path] = true
		for method := range item.GetOperations().FromOldest() {
			documented[strings.ToUpper(method)+" "+path] = true
		}
	}
	operational := map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true, "/openapi.json": true}
	s := newTestServer(t, dbs.SQLite)
	registered := map[string]bool{}
	for _, r := range s.app.GetRoutes(true) {
		if r.Method == http.MethodHead || !(strings.HasPrefix(r.Path, "/v1/") || operational[r.Path]) {
			continue // Fiber's automatic HEAD; dashboard routes
		}
		route := r.Method + " " + openAPIPathOf(r.Path, documentedPaths)
		registered[route] = true
		require.True(t, documented[route], "the server has %s %s, the document does not (as %s)", r.Method, r.Path, route)
	}
	for op := range documented {
		require.True(t, registered[op], "the document has %s, the server does not", op)
	}
	for p := range operational {
		require.True(t, registered["GET "+p], "operational endpoint %s not registered", p)
	}
}

// problemPairs collects, from the raw document, every (status, problem code) pair some
// operation documents, by following each problem response to its schema and reading the
// `status` and `code` it allows.
func problemPairs(t *testing.T) map[string][]string {
	t.Helper()
	var doc map[string]any
	require.NoError(t, json.Unmarshal(openAPIDocument, &doc))
	resolve := func(node map[string]any) map[string]any {
		for {
			ref, ok := node["$ref"].(string)
			if !ok {
				return node
			}
			var cur any = doc
			for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
				cur = cur.(map[string]any)[part]
			}
			node = cur.(map[string]any)
		}
	}
	// allowed reads const or enum of a property in a problem schema's allOf.
	allowed := func(schema map[string]any, prop string) []string {
		var out []string
		for _, part := range schema["allOf"].([]any) {
			props, _ := resolve(part.(map[string]any))["properties"].(map[string]any)
			p, ok := props[prop].(map[string]any)
			if !ok {
				continue
			}
			if c, ok := p["const"]; ok {
				out = append(out, fmt.Sprint(c))
			}
			for _, e := range asSlice(p["enum"]) {
				out = append(out, fmt.Sprint(e))
			}
		}
		return out
	}
	pairs := map[string][]string{} // "status code" -> the operations documenting it
	for path, item := range doc["paths"].(map[string]any) {
		for method, op := range item.(map[string]any) {
			for status, resp := range op.(map[string]any)["responses"].(map[string]any) {
				content, _ := resolve(resp.(map[string]any))["content"].(map[string]any)
				media, ok := content["application/problem+json"].(map[string]any)
				if !ok {
					continue
				}
				schema := resolve(media["schema"].(map[string]any))
				statuses := allowed(schema, "status")
				require.Equal(t, []string{status}, statuses, "%s %s %s: the problem schema's status", method, path, status)
				codes := allowed(schema, "code")
				require.NotEmpty(t, codes, "%s %s %s: the problem schema names no code", method, path, status)
				for _, code := range codes {
					pairs[status+" "+code] = append(pairs[status+" "+code], strings.ToUpper(method)+" "+path)
				}
			}
		}
	}
	return pairs
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

// TestOpenAPIDocumentListsEveryProblemCode: the Problem schema's code enum is exactly the codes
// of the error table (web/errors.go), each code is documented with the status the table gives
// it (not_owner also with 403 on the outcome route), and no operation documents a code with a
// status the server would not send it with.
func TestOpenAPIDocumentListsEveryProblemCode(t *testing.T) {
	t.Parallel()
	k := mustContract(t)
	var enum []string
	for _, n := range k.model.Components.Schemas.GetOrZero("ProblemCode").Schema().Enum {
		enum = append(enum, n.Value)
	}
	var table []string
	for code := range statusByCode {
		table = append(table, code)
	}
	require.ElementsMatch(t, table, enum, "ProblemCode's enum is the error table's codes")

	pairs := problemPairs(t)
	for code, status := range statusByCode {
		require.NotEmpty(t, pairs[strconv.Itoa(status)+" "+code], "no operation documents %d %s", status, code)
	}
	require.ElementsMatch(t, []string{"POST /v1/operations/{id}/outcome", "POST /v1/operations/{id}/renew"}, pairs["403 "+services.CodeNotOwner],
		"not_owner is 403 on the outcome and renew routes (web/errors.go outcomeRoute, renewRoute) and only there")
	// Fiber's own refusals keep their status with code invalid_request (errorHandler).
	fiberStatus := map[string]bool{"405 invalid_request": true, "431 invalid_request": true}
	var keys []string
	for p := range pairs {
		keys = append(keys, p)
	}
	sort.Strings(keys)
	for _, p := range keys {
		status, code, _ := strings.Cut(p, " ")
		want, known := statusByCode[code]
		require.True(t, known, "%s: code %s is not in the error table (documented for %v)", p, code, pairs[p])
		if strconv.Itoa(want) != status && !fiberStatus[p] && p != "403 "+services.CodeNotOwner {
			t.Errorf("%s documented for %v, but the error table answers %s with %d", p, pairs[p], code, want)
		}
	}
}

// TestOpenAPIServed: GET /openapi.json serves the embedded document, without an API key, as
// JSON with the security headers of every response.
func TestOpenAPIServed(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, dbs.SQLite)
	anon := &apiClient{t: t, s: s}
	res := anon.do("GET", "/openapi.json", nil)
	require.Equal(t, http.StatusOK, res.status, res.raw)
	require.Equal(t, "application/json", res.header.Get("Content-Type"))
	require.Equal(t, string(openAPIDocument), res.raw)
	require.Equal(t, "nosniff", res.header.Get("X-Content-Type-Options"))
	require.Equal(t, apiContentSecurityPolicy, res.header.Get("Content-Security-Policy"))

	// The HTTP layer's refusal of another method on a documented path matches the document too.
	require.Equal(t, http.StatusMethodNotAllowed, anon.do("POST", "/openapi.json", nil).status)
}

// TestReadyzUnavailableMatchesContract: /readyz with its database gone answers the documented
// 503 store_unavailable with Retry-After.
func TestReadyzUnavailableMatchesContract(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	gone := closedLater(t, models.SQLite)
	s := New(Config{Services: services.New(gone, log, services.Options{}), Log: log})
	require.NoError(t, gone.Close())
	res := problemOf(t, (&apiClient{t: t, s: s}).do("GET", "/readyz", nil), http.StatusServiceUnavailable, services.CodeStoreUnavailable)
	require.NotEmpty(t, res.header.Get("Retry-After"))
}

// TestContractRejectsDrift: the validation that apiClient.do runs does catch a response that
// drifted from the document: a renamed or missing member, a wrong type, an unknown code, a
// missing header, an undocumented status, and a request the server accepts but the document
// refuses.
func TestContractRejectsDrift(t *testing.T) {
	t.Parallel()
	k := mustContract(t)
	s := newTestServer(t, dbs.SQLite)
	c := newTenantClient(t, s)
	real := acquire(c, "drift-"+dashRandom(), map[string]any{"operation": "charge"})
	require.Equal(t, http.StatusCreated, real.status, real.raw)

	jsonHeader := http.Header{"Content-Type": {"application/json"}}
	problemHeader := http.Header{"Content-Type": {"application/problem+json"}}
	auth := http.Header{"Authorization": {"Bearer " + c.key}, "Content-Type": {"application/json"}}
	acquireBody := []byte(`{"key":"k","ttl_seconds":60}`)
	admitted := exchange{method: "POST", target: "/v1/acquire", header: auth, body: acquireBody,
		status: http.StatusCreated, respHeader: jsonHeader, respBody: []byte(real.raw)}
	require.Empty(t, k.check(admitted), "the real response matches")

	mutate := func(x exchange, f func(x *exchange)) exchange {
		f(&x)
		return x
	}
	replace := func(old, new string) func(x *exchange) {
		return func(x *exchange) {
			require.Contains(t, string(x.respBody), old)
			x.respBody = []byte(strings.Replace(string(x.respBody), old, new, 1))
		}
	}
	problem := `{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"d","code":"store_unavailable","request_id":"r"}`
	unavailable := exchange{method: "GET", target: "/v1/keys", header: auth, status: http.StatusServiceUnavailable,
		respHeader: http.Header{"Content-Type": {"application/problem+json"}, "Retry-After": {"2"}}, respBody: []byte(problem)}
	require.Empty(t, k.check(unavailable))

	cases := []struct {
		name string
		x    exchange
		want string // in the report
	}{
		{"member renamed", mutate(admitted, replace(`"fencing_token"`, `"fencing"`)), "fencing_token"},
		{"member of the wrong type", mutate(admitted, replace(`"fencing_token":1`, `"fencing_token":"1"`)), "fencing_token"},
		{"unknown state", mutate(admitted, replace(`"state":"in_progress"`, `"state":"running"`)), "state"},
		{"time not UTC", mutate(admitted, replace(`Z"`, `+01:00"`)), "expires_at"},
		{"undocumented status", mutate(admitted, func(x *exchange) { x.status = http.StatusAccepted }), "202"},
		{"undocumented content type", mutate(admitted, func(x *exchange) { x.respHeader = http.Header{"Content-Type": {"text/html"}} }), "text/html"},
		{"unknown problem code", mutate(unavailable, replace(`"store_unavailable"`, `"database_down"`)), "code"},
		{"problem code of another status", mutate(unavailable, replace(`"store_unavailable"`, `"not_found"`)), "code"},
		{"no Retry-After", mutate(unavailable, func(x *exchange) { x.respHeader = problemHeader }), "Retry-After"},
		{"errors[] on a non-validation problem", mutate(unavailable, replace(`"request_id"`, `"errors":[{"field":"key","message":"m"}],"request_id"`)), "errors"},
		{"the server accepts what the document refuses", mutate(admitted, func(x *exchange) { x.body = []byte(`{"key":"k","ttl_seconds":0}`) }), "refuses"},
		{"an undocumented refusal elsewhere", exchange{method: "GET", target: "/v1/nope", header: auth, status: http.StatusTeapot,
			respHeader: problemHeader, respBody: []byte(problem)}, "418"},
	}
	for _, tc := range cases {
		problems := k.check(tc.x)
		require.NotEmpty(t, problems, "%s: the validator must reject it", tc.name)
		require.Contains(t, strings.Join(problems, "\n"), tc.want, tc.name)
	}
}
