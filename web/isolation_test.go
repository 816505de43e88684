package web

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// isolationWorld is tenant B's objects, which tenant A must never see or change.
type isolationWorld struct {
	marker    string // every key of B starts with it, so any leak of a B key into a page shows
	held      *services.Acquisition
	uncertain string // an uncertain operation of B (its key re-acquired)
	other     string // a key B holds, whose name A then acquires for itself
}

// isolationSnapshot is everything about B's operations that an action could change.
type isolationSnapshot map[string]string

// The operator accounts checked are the one the admin actions target (victim) and the one
// they would create (newName); a count of all accounts would race with parallel tests.
func (f *dashFixture) isolationSnapshot(t *testing.T, victim, newName string, ids ...string) isolationSnapshot {
	t.Helper()
	out := isolationSnapshot{}
	for _, id := range ids {
		d := f.opDetail(t, f.pB, id)
		out[id] = d.State + "|held=" + strconv.FormatBool(d.Held) + "|events=" + strconv.Itoa(len(d.Events)) +
			"|attempts=" + strconv.Itoa(len(d.Attempts)) + "|outcome=" + strconv.FormatBool(d.Outcome != nil)
	}
	var n int64
	require.NoError(t, f.db.Model(&models.APIKey{}).Where("id = ? AND revoked_at IS NULL", f.pB.APIKeyID).Count(&n).Error)
	out["api-key-live"] = strconv.FormatInt(n, 10)
	var v models.Operator
	require.NoError(t, f.db.Where("username = ?", victim).Take(&v).Error)
	out["victim-role"] = v.Role
	require.NoError(t, f.db.Model(&models.Operator{}).Where("username = ?", newName).Count(&n).Error)
	out["created"] = strconv.FormatInt(n, 10)
	require.NoError(t, f.db.Model(&models.WebhookEndpoint{}).Where("tenant_id = ? AND deleted_at IS NULL AND disabled_at IS NULL", f.pB.TenantID).
		Count(&n).Error)
	out["live-webhooks"] = strconv.FormatInt(n, 10)
	var pols []models.Policy
	require.NoError(t, f.db.Where("tenant_id = ?", f.pB.TenantID).Order("operation_name").Find(&pols).Error)
	for _, p := range pols {
		out["policy "+p.OperationName] = fmt.Sprintf("ttl=%v by=%s", *p.TTLSeconds, p.UpdatedBy)
	}
	return out
}

// TestTenantIsolationMatrix calls every route of the service (the test fails when a route is
// added without a row here) as tenant A on tenant B's objects: JSON endpoints with A's API key,
// dashboard routes as an operator (and an admin) restricted to tenant A. Each B object answers
// 404 as if it did not exist, no listing, count or export shows B's keys, and nothing of B's
// changes (issue 4, docs/reference.md §5).
func TestTenantIsolationMatrix(t *testing.T) {
	t.Parallel()
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		ctx := context.Background()
		// Tenant B: a held key with duplicates and a conflict, an uncertain operation, a second
		// held key. Tenant A: one key in progress, so its pages are not trivially empty.
		w := isolationWorld{marker: "isob-" + dashRandom() + "-"}
		hookB, err := f.s.webhooks.CreateEndpoint(ctx, "isolation", services.WebhookEndpointInput{Tenant: f.tenantB,
			URL: "https://b.example/hook", Events: services.EventOperationUncertain})
		require.NoError(t, err)
		w.held = f.acquire(t, f.pB, w.marker+"held")
		f.acquire(t, f.pB, w.marker+"held")
		_, err = f.s.adm.Acquire(ctx, f.pB, services.AcquireInput{Key: w.marker + "held", TTLSeconds: 300,
			Operation: &f.op, Fingerprint: &w.marker})
		require.ErrorIs(t, err, services.ErrFingerprintMismatch)
		late, err := f.s.adm.Acquire(ctx, f.pB, services.AcquireInput{Key: w.marker + "late", TTLSeconds: 1, Operation: &f.op})
		require.NoError(t, err)
		elapse(t, f.db, f.pB, time.Second, w.marker+"late")
		require.True(t, f.acquire(t, f.pB, w.marker+"late").Admitted)
		w.uncertain = late.OperationID
		require.Equal(t, services.StateUncertain, f.opDetail(t, f.pB, w.uncertain).State)
		w.other = "shared-" + dashRandom() // not under the marker: A acquires this name for itself
		otherOp := f.acquire(t, f.pB, w.other)
		f.acquire(t, f.pA, "a-own")
		// B's policy for the operation: A asking for the policy in force must not see it.
		day := 24 * time.Hour
		_, err = f.s.policies.Set(ctx, services.Installation(), services.PolicyInput{Tenant: f.tenantB, Operation: f.op, TTL: &day})
		require.NoError(t, err)

		ids := []string{w.held.OperationID, w.uncertain, otherOp.OperationID}

		secretA, err := f.s.accounts.CreateAPIKey(ctx, services.Installation(), f.tenantA, "isolation", "")
		require.NoError(t, err)
		api := &apiClient{t: t, s: f.s, key: secretA}
		op := newDashBrowser(t, f.s)
		op.mustLogin(f.restricted)
		csrf := op.get("/keys").csrf(t)
		tenantAdmin := newDashBrowser(t, f.s)
		tenantAdmin.mustLogin(dashOperator(t, f.db, services.RoleAdmin, &f.pA.TenantID))
		adminCSRF := tenantAdmin.get("/keys").csrf(t)
		victim := dashOperator(t, f.db, services.RoleOperator, &f.pB.TenantID)
		var victimOp models.Operator
		require.NoError(t, f.db.Where("username = ?", victim).Take(&victimOp).Error)
		victimPath := "/admin/operators/" + strconv.FormatInt(victimOp.ID, 10)
		newName := "x-" + dashRandom()
		before := f.isolationSnapshot(t, victim, newName, ids...)

		noLeak := func(t *testing.T, body string) {
			t.Helper()
			// Whole key names: a filter form rightly echoes the marker typed into it.
			for _, k := range []string{w.marker + "held", w.marker + "late"} {
				require.NotContains(t, body, k, "a key of tenant B leaked")
			}
			require.NotContains(t, body, f.tenantB, "tenant B's name leaked")
			for _, id := range ids {
				require.NotContains(t, body, id, "an operation id of tenant B leaked")
			}
		}
		page := func(b *dashBrowser, status int) func(t *testing.T, path string) {
			return func(t *testing.T, path string) {
				p := b.get(path)
				require.Equal(t, status, p.status, "%s: %s", path, p.body)
				noLeak(t, p.body)
			}
		}
		post := func(b *dashBrowser, token string, form url.Values, status int) func(t *testing.T, path string) {
			return func(t *testing.T, path string) {
				form.Set("_csrf", token)
				p := b.post(path, form)
				require.Equal(t, status, p.status, "%s: %s", path, p.body)
				noLeak(t, p.body)
			}
		}
		apiCall := func(method string, body any, status int, code string) func(t *testing.T, path string) {
			return func(t *testing.T, path string) {
				res := api.do(method, path, body)
				if code != "" {
					problemOf(t, res, status, code)
				}
				require.Equal(t, status, res.status, res.raw)
				noLeak(t, res.raw)
			}
		}
		heldID, uncertainID := w.held.OperationID, w.uncertain
		explorePlayback := uuid.NewString()
		hookPath := adminWebhooksURL + "/" + strconv.FormatInt(hookB.Endpoint.ID, 10)
		bAPIKey := strconv.FormatInt(f.pB.APIKeyID, 10)

		type call struct {
			path string
			run  func(t *testing.T, path string)
		}
		// matrix maps each registered route ("METHOD /pattern") to its calls, or to nil with a
		// reason in noTenantData.
		// A bulk job of tenant B (its filter matches nothing, so B's operations stay as they are).
		bJob, err := f.s.recon.BulkReconcileForAPI(context.Background(), f.pB, services.BulkReconcileInput{JobID: "b-job",
			Status: services.StateFailed, Note: "b", Filter: &services.BulkFilter{UncertainBefore: time.Unix(1, 0)}})
		require.NoError(t, err)
		// A bulk job naming B's operations: each is skipped as "not found", exactly as an unknown
		// id would be, and nothing of B's changes. The answer echoes only the ids A sent.
		allSkipped := func(t *testing.T, raw string, results []any) {
			t.Helper()
			require.NotContains(t, raw, f.tenantB, "tenant B's name leaked")
			for _, r := range results {
				m := r.(map[string]any)
				require.Equal(t, "skipped", m["result"], raw)
				require.Equal(t, "not found", m["detail"], raw)
			}
		}
		matrix := map[string][]call{
			// MCP (mcp.go) with A's API key: every tool answers about B's keys and operations as
			// if they did not exist, and A's reconciliation queue does not list B's.
			"POST /mcp": {{"/mcp", func(t *testing.T, path string) {
				for _, c := range []struct {
					tool, code string
					args       map[string]any
				}{
					{"status", "not_found", map[string]any{"operation_id": heldID}},
					{"status", "not_found", map[string]any{"operation_id": uncertainID, "wait_seconds": 1}},
					{"status", "not_found", map[string]any{"key": w.marker + "held"}},
					{"complete", "not_found", map[string]any{"operation_id": uncertainID, "owner_token": "ot_x", "status": "failed"}},
					{"renew", "not_found", map[string]any{"operation_id": heldID, "owner_token": "ot_x", "lease_seconds": 5}},
					{"release", "key_not_held", map[string]any{"key": w.marker + "held", "owner_token": "ot_x"}},
					{"list_uncertain", "", map[string]any{}},
				} {
					raw, refused, out := mcpCallInProcess(t, f.s, api.key, c.tool, c.args)
					noLeak(t, raw)
					require.Equal(t, c.code != "", refused, raw)
					if c.code != "" {
						require.Equal(t, c.code, out["code"], raw)
					}
				}
			}}},
			"POST /v1/reconciliations": {
				{"/v1/reconciliations", func(t *testing.T, path string) {
					res := api.do("POST", path, map[string]any{"job_id": "a-job", "status": "failed", "note": "n",
						"operation_ids": []string{heldID, uncertainID}})
					require.Equal(t, http.StatusCreated, res.status, res.raw)
					allSkipped(t, res.raw, res.body["results"].([]any))
				}},
				{"/v1/reconciliations", func(t *testing.T, path string) {
					res := api.do("POST", path, map[string]any{"job_id": "a-filter", "status": "failed", "note": "n", "filter": map[string]any{}})
					require.Equal(t, http.StatusCreated, res.status, res.raw)
					require.Empty(t, res.body["results"], "B's uncertain operation is not in A's filter")
					noLeak(t, res.raw)
				}},
			},
			"GET /reconciliation/next": {{"/reconciliation/next", func(t *testing.T, path string) {
				p := op.get(path)
				require.Equal(t, http.StatusSeeOther, p.status)
				require.Equal(t, "/reconciliation", p.header.Get("Location"), "A's queue is empty")
			}}},
			"POST /reconciliation/jobs": {{"/reconciliation/jobs", func(t *testing.T, path string) {
				p := op.post(path, url.Values{"_csrf": {csrf}, "job_id": {"a-dash"}, "scope": {"selected"}, "status": {"failed"},
					"note": {"n"}, "operation_ids": {uncertainID}})
				require.Equal(t, http.StatusSeeOther, p.status, p.body)
				job := op.get(p.header.Get("Location"))
				require.Equal(t, http.StatusOK, job.status)
				require.Equal(t, "skipped", job.testid("job-row").AttrOr("data-result", ""))
				require.Contains(t, job.testid("job-row").Text(), "not found")
				all := op.post(path, url.Values{"_csrf": {csrf}, "job_id": {"a-dash-all"}, "scope": {"filter"}, "status": {"failed"},
					"note": {"n"}, "tenant": {strconv.FormatInt(f.pB.TenantID, 10)}})
				require.Equal(t, http.StatusSeeOther, all.status, all.body)
				require.Zero(t, op.get(all.header.Get("Location")).testid("job-row").Length(), "a tenant parameter does not widen a restricted account")
			}}},
			"GET /reconciliation/jobs/:id": {{"/reconciliation/jobs/" + bJob.ID, page(op, 404)}},
			"POST /v1/acquire": {{"/v1/acquire", func(t *testing.T, path string) {
				// B's key name is a different key in A: admitted there with fencing token 1.
				res := api.do("POST", path, map[string]any{"key": w.other, "ttl_seconds": 60})
				require.Equal(t, http.StatusCreated, res.status, res.raw)
				require.EqualValues(t, 1, res.body["fencing_token"])
				require.NotEqual(t, otherOp.OperationID, res.body["operation_id"])
			}}},
			// The batch: B's key name is a different key in A, admitted there with fencing token 1
			// and no previous operation (B's uncertain one), then a duplicate of A's own hold. No
			// result shows B's operations or tenant. (Not B's held key: the release row after
			// this one expects A to hold nothing under that name.)
			`POST /v1/acquire\:batch`: {{"/v1/acquire:batch", func(t *testing.T, path string) {
				item := map[string]any{"key": w.marker + "late", "ttl_seconds": 60, "operation": f.op}
				res := api.do("POST", path, map[string]any{"items": []any{item, item}})
				require.Equal(t, http.StatusOK, res.status, res.raw)
				results := res.body["results"].([]any)
				require.Len(t, results, 2)
				first, second := results[0].(map[string]any), results[1].(map[string]any)
				require.EqualValues(t, http.StatusCreated, first["status"], res.raw)
				admitted := first["body"].(map[string]any)
				require.EqualValues(t, 1, admitted["fencing_token"])
				require.Nil(t, admitted["previous_operation"], "B's uncertain operation is not A's previous one")
				require.EqualValues(t, http.StatusOK, second["status"], res.raw)
				holder := second["body"].(map[string]any)["operation"].(map[string]any)
				require.Equal(t, admitted["operation_id"], holder["id"], "the duplicate is of A's own hold")
				require.EqualValues(t, 1, holder["duplicate_attempts"])
				// The bodies rightly echo the key name A sent; B's objects must not appear.
				for _, id := range ids {
					require.NotContains(t, res.raw, id, "an operation id of tenant B leaked")
				}
				require.NotContains(t, res.raw, f.tenantB, "tenant B's name leaked")
			}}},
			"POST /v1/release": {{"/v1/release", apiCall("POST", map[string]any{"key": w.marker + "held",
				"owner_token": w.held.OwnerToken}, 404, "key_not_held")}},
			"POST /v1/operations/:id/outcome": {
				{"/v1/operations/" + heldID + "/outcome", apiCall("POST", map[string]any{"owner_token": w.held.OwnerToken,
					"status": "succeeded"}, 404, "not_found")},
				{"/v1/operations/" + uncertainID + "/outcome", apiCall("POST", map[string]any{"owner_token": w.held.OwnerToken,
					"status": "failed"}, 404, "not_found")},
			},
			"POST /v1/operations/:id/renew": {
				{"/v1/operations/" + heldID + "/renew", apiCall("POST", map[string]any{"owner_token": w.held.OwnerToken,
					"lease_seconds": 30}, 404, "not_found")},
			},
			"GET /v1/operations/:id": {
				{"/v1/operations/" + heldID, apiCall("GET", nil, 404, "not_found")},
				{"/v1/operations/" + uncertainID, apiCall("GET", nil, 404, "not_found")},
			},
			"GET /v1/keys": {
				{"/v1/keys", apiCall("GET", nil, 200, "")},
				{"/v1/keys?prefix=" + url.QueryEscape(w.marker), apiCall("GET", nil, 200, "")},
				{"/v1/keys?state=uncertain", apiCall("GET", nil, 200, "")},
			},
			// B's uncertain operation is superseded (its key was taken over): the queue lists
			// such operations, so it is the list most likely to leak one.
			"GET /v1/operations": {{"/v1/operations?state=uncertain", func(t *testing.T, path string) {
				res := api.do("GET", path, nil)
				require.Equal(t, http.StatusOK, res.status, res.raw)
				require.Empty(t, res.body["items"])
				noLeak(t, res.raw)
			}}},
			"GET /v1/keys/*": {{"/v1/keys/" + url.PathEscape(w.marker+"held"), apiCall("GET", nil, 404, "not_found")}},
			"GET /v1/policy": {{"/v1/policy?operation=" + url.QueryEscape(f.op), func(t *testing.T, path string) {
				res := api.do("GET", path, nil)
				require.Equal(t, http.StatusOK, res.status, res.raw)
				require.Nil(t, res.body["ttl_seconds"], "tenant B's policy applied to A")
				require.Equal(t, f.tenantA, res.body["tenant"])
				noLeak(t, res.raw)
			}}},
			"GET /v1/attempts": {
				{"/v1/attempts", apiCall("GET", nil, 200, "")},
				{"/v1/attempts?key=" + url.QueryEscape(w.marker+"held"), apiCall("GET", nil, 200, "")},
			},

			"GET /": {{"/", func(t *testing.T, path string) {
				p := op.get(path)
				require.Equal(t, http.StatusOK, p.status)
				noLeak(t, p.body)
				// Only A's one key counts; B's uncertain operation is not A's to reconcile.
				require.EqualValues(t, 1, overviewCount(t, p, "overview-count-in_progress"))
				require.EqualValues(t, 0, overviewCount(t, p, "overview-count-uncertain"))
				require.EqualValues(t, 0, overviewCount(t, p, "overview-needs-reconciliation"))
			}}},
			"GET /keys": {
				{"/keys", page(op, 200)},
				{"/keys?prefix=" + url.QueryEscape(w.marker), page(op, 200)},
				{"/keys?state=uncertain", page(op, 200)},
				{"/keys?state=in_progress&expiring=1", page(op, 200)},
				{"/keys?operation=" + url.QueryEscape(f.op), page(op, 200)},
			},
			"GET /reconciliation": {{"/reconciliation", func(t *testing.T, path string) {
				p := op.get(path)
				require.Equal(t, http.StatusOK, p.status, p.body)
				noLeak(t, p.body)
				require.Zero(t, p.testid("queue-row").Length())
			}}},
			"GET /operations/:id": {
				{"/operations/" + heldID, page(op, 404)},
				{"/operations/" + uncertainID, page(op, 404)},
			},
			"POST /operations/:id/outcome": {{"/operations/" + uncertainID + "/outcome",
				post(op, csrf, url.Values{"status": {"failed"}, "note": {"reconciled by A"}}, 404)}},
			"POST /operations/:id/release": {{"/operations/" + heldID + "/release",
				post(op, csrf, url.Values{"operation_id": {heldID}, "fencing_token": {"1"}, "reason": {"r"}, "confirm": {"yes"}}, 404)}},
			// Explore plays in a sandbox store of its own: nothing of any tenant to show or change.
			"GET /explore": {{"/explore", page(op, 200)}, {"/explore?playback=" + explorePlayback + "&step=8", page(op, 200)}},
			"POST /explore/next": {{"/explore/next", post(op, csrf, url.Values{"playback": {explorePlayback}, "step": {"3"}},
				http.StatusSeeOther)}},
			"POST /explore/reset": {{"/explore/reset", post(op, csrf, url.Values{}, http.StatusSeeOther)}},
			"GET /audit": {
				{"/audit", page(op, 200)},
				{"/audit?tenant=" + url.QueryEscape(f.tenantB), page(op, 200)},
			},
			"GET /audit.csv": {
				{"/audit.csv", page(op, 200)},
				{"/audit.csv?tenant=" + url.QueryEscape(f.tenantB), page(op, 200)},
			},
			// The admin page is installation-wide: a tenant's own admin is refused outright.
			"GET /admin":                       {{"/admin", page(tenantAdmin, 403)}},
			"POST /admin/api-keys":             {{"/admin/api-keys", post(tenantAdmin, adminCSRF, url.Values{"tenant": {f.tenantB}, "label": {"x"}}, 403)}},
			"POST /admin/api-keys/:id/revoke":  {{"/admin/api-keys/" + bAPIKey + "/revoke", post(tenantAdmin, adminCSRF, url.Values{"confirm": {"yes"}}, 403)}},
			"POST /admin/operators":            {{"/admin/operators", post(tenantAdmin, adminCSRF, url.Values{"username": {newName}, "role": {"admin"}, "password": {"a-long-password-1"}}, 403)}},
			"POST /admin/operators/:id/role":   {{victimPath + "/role", post(tenantAdmin, adminCSRF, url.Values{"role": {"auditor"}}, 403)}},
			"POST /admin/operators/:id/delete": {{victimPath + "/delete", post(tenantAdmin, adminCSRF, url.Values{"confirm": {"yes"}}, 403)}},
			// Webhook endpoints are managed by global admins only; tenant B's endpoint and its
			// delivery stay out of A's delivery log.
			"POST /admin/webhooks": {{"/admin/webhooks", post(tenantAdmin, adminCSRF, url.Values{"tenant": {f.tenantB},
				"url": {"https://a.example/steal"}, "events": {services.EventOperationUncertain}}, 403)}},
			"POST /admin/policies": {{"/admin/policies", post(tenantAdmin, adminCSRF, url.Values{"tenant": {f.tenantB},
				"operation": {f.op}, "ttl": {"1s"}}, 403)}},
			"POST /admin/policies/delete": {{"/admin/policies/delete", post(tenantAdmin, adminCSRF, url.Values{"tenant": {f.tenantB},
				"operation": {f.op}, "confirm": {"yes"}}, 403)}},
			"POST /admin/webhooks/:id/disable": {{hookPath + "/disable", post(tenantAdmin, adminCSRF, url.Values{}, 403)}},
			"POST /admin/webhooks/:id/enable":  {{hookPath + "/enable", post(tenantAdmin, adminCSRF, url.Values{}, 403)}},
			"POST /admin/webhooks/:id/delete":  {{hookPath + "/delete", post(tenantAdmin, adminCSRF, url.Values{"confirm": {"yes"}}, 403)}},
			"GET /webhooks": {
				{"/webhooks", page(op, 200)},
				{"/webhooks", page(tenantAdmin, 200)},
			},
			// Operational: never names a key or an operation. It does name tenants: acquires and
			// operations needing reconciliation are labelled by tenant (issue 5), so /metrics is
			// for the operators' Prometheus and must be kept off networks tenants reach.
			"GET /metrics": {{"/metrics", func(t *testing.T, path string) {
				res := api.do("GET", path, nil)
				require.Equal(t, http.StatusOK, res.status)
				for _, k := range []string{w.marker + "held", w.marker + "late"} {
					require.NotContains(t, res.raw, k, "a key of tenant B leaked")
				}
				for _, id := range ids {
					require.NotContains(t, res.raw, id, "an operation id of tenant B leaked")
				}
			}}},
		}
		noTenantData := map[string]string{
			"GET /healthz":      "liveness: no tenant data",
			"GET /readyz":       "readiness: no tenant data",
			"GET /openapi.json": "the API contract: no tenant data",
			"GET /login":        "the sign-in form: no tenant data",
			"POST /login":       "signs in: no tenant data",
			"POST /logout":      "signs out: no tenant data",
			"GET /static/*":     "embedded assets",
		}

		var routes []string
		for _, r := range f.s.app.GetRoutes(true) {
			if r.Method == http.MethodHead {
				continue // Fiber's automatic HEAD for each GET
			}
			routes = append(routes, r.Method+" "+r.Path)
		}
		sort.Strings(routes)
		for _, r := range routes {
			_, listed := noTenantData[r]
			require.True(t, listed || matrix[r] != nil, "route %s has no row in the tenant-isolation matrix", r)
		}
		for r := range matrix {
			require.Contains(t, routes, r, "the matrix names a route the server does not have")
		}
		for _, route := range routes { // sorted: GET / runs before A acquires a key of its own
			calls := matrix[route]
			for _, c := range calls {
				t.Run(strings.ReplaceAll(route+" "+c.path, "/", "_"), func(t *testing.T) { c.run(t, c.path) })
			}
		}
		require.Equal(t, before, f.isolationSnapshot(t, victim, newName, ids...), "nothing of tenant B's changed")
	})
}
