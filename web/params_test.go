package web

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// routeParams is what a route reads from the request besides a JSON body: its path with a valid
// value in place of each parameter (path), the path parameters' positions in it (pathParams:
// the literal values to replace), and its query parameters and form fields (with valid values).
type routeParams struct {
	path       string
	pathParams []string
	query      url.Values
	form       url.Values
}

// unstorable are parameter values neither database can store as text, percent-encoded as a
// client sends them: NUL, a lone continuation byte, a truncated sequence, an overlong encoding.
var unstorable = []string{"%00", "%FF", "a%00b", "%C3", "%C0%AF", "x%FFy"}

// paramSweepWorld builds a server on db with what every route needs to do real work: an API
// key, an operation (held), a global admin signed in to the dashboard with its CSRF token.
type paramSweepWorld struct {
	s     *Server
	api   *apiClient
	admin *dashBrowser
	csrf  string
	opID  string
	opKey string
	keyID string
	opr   string // an operator account's id, for /admin/operators/:id/…
	hook  string // a webhook endpoint's id, for /admin/webhooks/:id/…
}

func newParamSweepWorld(t *testing.T, db *models.DB) *paramSweepWorld {
	ctx := context.Background()
	s := New(testConfig(t, db, slog.New(slog.DiscardHandler)))
	w := &paramSweepWorld{s: s}
	tenant := "sweep-" + dashRandom()
	secret, err := s.accounts.CreateAPIKey(ctx, services.Installation(), tenant, "sweep", "")
	require.NoError(t, err)
	w.api = &apiClient{t: t, s: s, key: secret}
	p, err := s.auth.Authenticate(ctx, secret)
	require.NoError(t, err)
	w.keyID = strconv.FormatInt(p.APIKeyID, 10)
	w.opKey = "sweep/" + dashRandom()
	acq, err := s.adm.Acquire(ctx, p, services.AcquireInput{Key: w.opKey, TTLSeconds: 300})
	require.NoError(t, err)
	w.opID = acq.OperationID
	w.admin = newDashBrowser(t, s)
	w.admin.mustLogin(dashOperator(t, db, services.RoleAdmin, nil))
	w.csrf = w.admin.get("/keys").csrf(t)
	var victim models.Operator
	name := dashOperator(t, db, services.RoleAuditor, nil)
	require.NoError(t, db.Where("username = ?", name).Take(&victim).Error)
	w.opr = strconv.FormatInt(victim.ID, 10)
	ep, err := s.webhooks.CreateEndpoint(ctx, "sweep", services.WebhookEndpointInput{Tenant: tenant,
		URL: "https://hooks.example/sweep", Events: services.EventOperationUncertain})
	require.NoError(t, err)
	w.hook = strconv.FormatInt(ep.Endpoint.ID, 10)
	return w
}

// routes maps each registered route ("METHOD /pattern") to its parameters. A route missing here
// fails TestUnstorableParamsRefusedOnEveryRoute.
func (w *paramSweepWorld) routes() map[string]routeParams {
	q := func(kv ...string) url.Values {
		v := url.Values{}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	encKey := url.PathEscape(w.opKey)
	return map[string]routeParams{
		"GET /healthz":      {path: "/healthz"},
		"GET /readyz":       {path: "/readyz"},
		"GET /metrics":      {path: "/metrics"},
		"GET /openapi.json": {path: "/openapi.json"},
		"GET /static/*":     {path: "/static/app.css", pathParams: []string{"app.css"}, query: q("v", "1")},

		"POST /v1/acquire":                {path: "/v1/acquire"},
		`POST /v1/acquire\:batch`:         {path: "/v1/acquire:batch"},
		"POST /v1/release":                {path: "/v1/release"},
		"POST /v1/operations/:id/outcome": {path: "/v1/operations/" + w.opID + "/outcome", pathParams: []string{w.opID}},
		"POST /v1/operations/:id/renew":   {path: "/v1/operations/" + w.opID + "/renew", pathParams: []string{w.opID}},
		"GET /v1/operations/:id":          {path: "/v1/operations/" + w.opID, pathParams: []string{w.opID}},
		"GET /v1/keys": {path: "/v1/keys", query: q("state", "in_progress", "operation", "charge", "prefix", "sweep",
			"limit", "10", "cursor", "")},
		"GET /v1/keys/*":     {path: "/v1/keys/" + encKey, pathParams: []string{encKey}},
		"GET /v1/operations": {path: "/v1/operations", query: q("state", "uncertain", "limit", "10", "cursor", "")},
		"GET /v1/policy":     {path: "/v1/policy", query: q("operation", "charge")},
		"GET /v1/attempts": {path: "/v1/attempts", query: q("key", w.opKey, "result", "admitted",
			"since", "2026-01-02T15:04:05Z", "limit", "10", "cursor", "")},

		"GET /login":   {path: "/login", query: q("next", "/keys")},
		"POST /login":  {path: "/login", form: q("username", "nobody", "password", "not-the-password", "next", "/keys")},
		"POST /logout": {path: "/logout", form: q()},
		"GET /":        {path: "/", query: q("range", "7d")},
		"GET /keys": {path: "/keys", query: q("state", "in_progress", "operation", "charge", "prefix", "sweep",
			"expiring", "1", "cursor", "", "newer", "", "limit", "10")},
		"GET /operations/:id": {path: "/operations/" + w.opID, pathParams: []string{w.opID}, query: q("done", "released", "back", "/keys", "recorded", w.opID)},
		"POST /operations/:id/outcome": {path: "/operations/" + w.opID + "/outcome", pathParams: []string{w.opID},
			form: q("status", "failed", "receipt", "r-1", "note", "checked", "back", "/reconciliation")},
		"POST /operations/:id/release": {path: "/operations/" + w.opID + "/release", pathParams: []string{w.opID},
			form: q("operation_id", w.opID, "fencing_token", "1", "reason", "why", "confirm", "yes")},
		"GET /reconciliation":      {path: "/reconciliation", query: q("cursor", "", "back", "", "tenant", "1", "reason", "ttl_expired_without_outcome", "before", "2026-01-02T15:04")},
		"GET /reconciliation/next": {path: "/reconciliation/next", query: q("tenant", "1", "reason", "x", "before", "2026-01-02T15:04")},
		"POST /reconciliation/jobs": {path: "/reconciliation/jobs", form: q("job_id", "sweep-"+dashRandom(), "scope", "selected",
			"operation_ids", w.opID, "status", "failed", "note", "n", "tenant", "", "reason", "", "before", "")},
		"GET /reconciliation/jobs/:id": {path: "/reconciliation/jobs/" + w.opID, pathParams: []string{w.opID}},
		"POST /v1/reconciliations":     {path: "/v1/reconciliations"},
		"POST /mcp":                    {path: "/mcp"}, // mcp.go: refused by the middleware before the API key
		"GET /explore":                 {path: "/explore", query: q("playback", "01a24ecc-2ca8-7749-8260-d296e74e8dfb", "step", "1")},
		"POST /explore/next":           {path: "/explore/next", form: q("playback", "01a24ecc-2ca8-7749-8260-d296e74e8dfb", "step", "0")},
		"POST /explore/reset":          {path: "/explore/reset", form: q()},
		"GET /audit":                   {path: "/audit", query: q("from", "2026-01-01", "to", "2026-12-31", "tenant", "x")},
		"GET /audit.csv":               {path: "/audit.csv", query: q("from", "2026-01-01", "to", "2026-12-31", "tenant", "x")},
		"GET /admin":                   {path: "/admin", query: q("done", "created")},
		"POST /admin/api-keys":         {path: "/admin/api-keys", form: q("tenant", "t-"+dashRandom(), "label", "l")},
		"POST /admin/api-keys/:id/revoke": {path: "/admin/api-keys/" + w.keyID + "/revoke", pathParams: []string{w.keyID},
			form: q("confirm", "yes")},
		"POST /admin/operators": {path: "/admin/operators", form: q("username", "u-"+dashRandom(), "role", "auditor",
			"tenant", "", "password", "a-long-password-1")},
		"POST /admin/operators/:id/role": {path: "/admin/operators/" + w.opr + "/role", pathParams: []string{w.opr},
			form: q("role", "operator")},
		"POST /admin/operators/:id/delete": {path: "/admin/operators/" + w.opr + "/delete", pathParams: []string{w.opr},
			form: q("confirm", "yes")},
		"POST /admin/policies": {path: "/admin/policies", form: q("tenant", "sweep", "operation", "charge", "ttl", "1h",
			"lease", "1m", "on_expiry", "readmit", "retention", "1d", "horizon", "2d")},
		"POST /admin/policies/delete": {path: "/admin/policies/delete", form: q("tenant", "sweep", "operation", "charge",
			"confirm", "yes")},
		"POST /admin/webhooks": {path: "/admin/webhooks", form: q("tenant", "sweep", "url", "https://hooks.example/x",
			"events", "operation.uncertain")},
		"POST /admin/webhooks/:id/disable": {path: "/admin/webhooks/" + w.hook + "/disable", pathParams: []string{w.hook}},
		"POST /admin/webhooks/:id/enable":  {path: "/admin/webhooks/" + w.hook + "/enable", pathParams: []string{w.hook}},
		"POST /admin/webhooks/:id/delete": {path: "/admin/webhooks/" + w.hook + "/delete", pathParams: []string{w.hook},
			form: q("confirm", "yes")},
		"GET /webhooks": {path: "/webhooks", query: q("status", "pending")},
	}
}

// send makes one request to the route: the path as given, query and form already encoded (so
// a bad value can be spliced in raw), as the API client (for /v1 and operational routes) or as
// the signed-in admin's browser (dashboard routes, with the CSRF token added to forms). With
// check, a non-dashboard answer is also checked against openapi.json (the fuzz target only
// looks for 5xx: the document is stricter than the server about, e.g., empty filters).
func (w *paramSweepWorld) send(t testing.TB, check bool, method, path, rawQuery, rawForm string) (int, http.Header, string) {
	target := path
	if rawQuery != "" {
		target += "?" + rawQuery
	}
	dashboard := !strings.HasPrefix(path, "/v1/") && path != "/healthz" && path != "/readyz" && path != "/metrics" &&
		path != "/openapi.json" && !strings.HasPrefix(path, "/static/")
	var body *strings.Reader
	if method == http.MethodPost {
		if strings.HasPrefix(path, "/v1/") {
			body = strings.NewReader(`{}`)
		} else {
			if rawForm != "" {
				rawForm += "&"
			}
			body = strings.NewReader(rawForm + "_csrf=" + url.QueryEscape(w.csrf))
		}
	}
	var req *http.Request
	if body != nil {
		req = httptest.NewRequest(method, target, body)
	} else {
		req = httptest.NewRequest(method, target, nil)
	}
	switch {
	case strings.HasPrefix(path, "/v1/"):
		req.Header.Set("Authorization", "Bearer "+w.api.key)
		req.Header.Set("Content-Type", "application/json")
	case dashboard:
		req.Header.Set("Accept", "text/html")
		if method == http.MethodPost {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		for _, c := range w.admin.cookies {
			req.AddCookie(&http.Cookie{Name: c.Name, Value: c.Value})
		}
	}
	resp, err := w.s.app.Test(req, -1)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if check && !dashboard {
		// The refusals are part of the API contract like any answer (openapi_test.go).
		var sent []byte
		if body != nil {
			_, _ = body.Seek(0, io.SeekStart)
			sent, _ = io.ReadAll(body)
		}
		checkContract(t, exchange{method: method, target: target, header: req.Header, body: sent,
			status: resp.StatusCode, respHeader: resp.Header, respBody: raw})
	}
	return resp.StatusCode, resp.Header, string(raw)
}

// TestUnstorableParamsRefusedOnEveryRoute sends, to every registered route (the test fails when a
// route is added without a row in routes()), NUL and invalid UTF-8 in each of its path
// parameters, query parameters and form fields in turn, and in a parameter no route reads, on
// both dialects: every such request is 400 invalid_request (problem+json naming the parameter
// for the API and operational routes, the HTML error page for the dashboard), never a 5xx (issue
// 9: PostgreSQL refused the text and the handlers answered 500).
func TestUnstorableParamsRefusedOnEveryRoute(t *testing.T) {
	t.Parallel()
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		w := newParamSweepWorld(t, db)
		table := w.routes()
		var routes []string
		for _, r := range w.s.app.GetRoutes(true) {
			if r.Method == http.MethodHead {
				continue
			}
			routes = append(routes, r.Method+" "+r.Path)
		}
		// Static files are served by a middleware (app.Use), which GetRoutes leaves out.
		routes = append(routes, "GET /static/*")
		sort.Strings(routes)
		for _, r := range routes {
			_, ok := table[r]
			require.True(t, ok, "route %s has no row in the parameter sweep", r)
		}
		for r := range table {
			require.Contains(t, routes, r, "the sweep names a route the server does not have")
		}
		for _, route := range routes {
			method, _, _ := strings.Cut(route, " ")
			rp := table[route]
			type variant struct{ name, path, query, form string }
			var variants []variant
			for _, bad := range unstorable {
				for _, pp := range rp.pathParams {
					variants = append(variants, variant{"path " + pp + "=" + bad,
						strings.Replace(rp.path, pp, bad, 1), rp.query.Encode(), rp.form.Encode()})
				}
				for _, name := range append(sortedKeys(rp.query), "zz") {
					variants = append(variants, variant{"query " + name + "=" + bad, rp.path,
						spliced(rp.query, name, bad), rp.form.Encode()})
				}
				variants = append(variants, variant{"query name " + bad, rp.path, rp.query.Encode() + "&" + bad + "=1", rp.form.Encode()})
				if method == http.MethodPost && !strings.HasPrefix(rp.path, "/v1/") {
					for _, name := range append(sortedKeys(rp.form), "zz") {
						variants = append(variants, variant{"form " + name + "=" + bad, rp.path, rp.query.Encode(),
							spliced(rp.form, name, bad)})
					}
				}
			}
			for _, v := range variants {
				status, h, body := w.send(t, true, method, v.path, v.query, v.form)
				// Every failure is reported, not only the first, so that one run shows them all.
				switch {
				case status >= 500:
					t.Errorf("%s %s: server error %d: %s", route, v.name, status, truncate([]byte(body), 200))
				case status != http.StatusBadRequest:
					t.Errorf("%s %s: %d, want 400: %s", route, v.name, status, truncate([]byte(body), 200))
				case strings.HasPrefix(h.Get("Content-Type"), "text/html"):
					if !strings.Contains(body, "not valid UTF-8") {
						t.Errorf("%s %s: 400 page without the reason: %s", route, v.name, truncate([]byte(body), 200))
					}
				case h.Get("Content-Type") != "application/problem+json" || !strings.Contains(body, `"code":"invalid_request"`):
					t.Errorf("%s %s: 400 that is not invalid_request: %s", route, v.name, truncate([]byte(body), 200))
				}
			}
		}
	})
}

func sortedKeys(v url.Values) []string {
	out := make([]string, 0, len(v))
	for k := range v {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// spliced encodes v with name's value replaced by raw (already percent-encoded), so that bytes
// url.Values would re-encode reach the server as the client wrote them.
func spliced(v url.Values, name, raw string) string {
	rest := url.Values{}
	for k, vs := range v {
		if k != name {
			rest[k] = vs
		}
	}
	enc := rest.Encode()
	if enc != "" {
		enc += "&"
	}
	return enc + url.QueryEscape(name) + "=" + raw
}

// FuzzParamsOnPostgres sends fuzzed values, on the real server over the PostgreSQL test
// database, as one path parameter, query parameter or form field of one route (chosen by the
// fuzzer among every registered route's parameters) and fails on any 5xx: whatever a client
// puts in a parameter is its own mistake, never an internal error.
func FuzzParamsOnPostgres(f *testing.F) {
	for i, v := range []string{"\x00", "\xff", "a\x00b", "\xc3", "k/ü:1", "", " ", "%", "-1", "99999999999999999999",
		"2026-13-45T99:99:99Z", strings.Repeat("x", 300), "\u2028", "\ufffd"} {
		f.Add(uint8(i), uint8(i*3), v)
	}
	var (
		once  sync.Once
		w     *paramSweepWorld
		slots []paramSlot
	)
	f.Fuzz(func(t *testing.T, route, slot uint8, value string) {
		once.Do(func() {
			w = newParamSweepWorld(t, dbs.Postgres)
			slots = w.slots()
		})
		s := slots[(int(route)<<8|int(slot))%len(slots)]
		status, _, body := w.send(t, false, s.method, s.path(value), s.query(value), s.form(value))
		if status >= 500 {
			t.Fatalf("%s %s with %q: %d %s", s.method, s.name, value, status, body)
		}
	})
}

// paramSlot is one parameter of one route, as a way to build a request around a value.
type paramSlot struct {
	method, name      string
	path, query, form func(value string) string
}

// slots lists every parameter of every route in routes(), sorted so that fuzzer inputs keep
// their meaning between runs.
func (w *paramSweepWorld) slots() []paramSlot {
	table := w.routes()
	var out []paramSlot
	for _, route := range sortedRouteNames(table) {
		rp := table[route]
		method, _, _ := strings.Cut(route, " ")
		fixed := func(s string) func(string) string { return func(string) string { return s } }
		for _, pp := range rp.pathParams {
			out = append(out, paramSlot{method: method, name: route + " path " + pp,
				path:  func(v string) string { return strings.Replace(rp.path, pp, url.PathEscape(v), 1) },
				query: fixed(rp.query.Encode()), form: fixed(rp.form.Encode())})
		}
		for _, name := range append(sortedKeys(rp.query), "zz") {
			out = append(out, paramSlot{method: method, name: route + " query " + name, path: fixed(rp.path),
				query: func(v string) string { return spliced(rp.query, name, url.QueryEscape(v)) }, form: fixed(rp.form.Encode())})
		}
		if method == http.MethodPost && !strings.HasPrefix(rp.path, "/v1/") {
			for _, name := range append(sortedKeys(rp.form), "zz") {
				out = append(out, paramSlot{method: method, name: route + " form " + name, path: fixed(rp.path),
					query: fixed(rp.query.Encode()), form: func(v string) string { return spliced(rp.form, name, url.QueryEscape(v)) }})
			}
		}
	}
	return out
}

func sortedRouteNames(m map[string]routeParams) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
