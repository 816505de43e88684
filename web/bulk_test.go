package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/PuerkitoBio/goquery"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// TestReconciliationsAPI: POST /v1/reconciliations creates a job (201) recorded as
// api:<prefix>, a repeat answers 200 with the same job, a reused job_id with another request
// 409, invalid bodies 400 naming the field; every answer matches openapi.json.
func TestReconciliationsAPI(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		ctx := context.Background()
		secret, err := f.s.accounts.CreateAPIKey(ctx, services.Installation(), f.tenantA, "bulk", "")
		require.NoError(t, err)
		api := &apiClient{t: t, s: f.s, key: secret}
		p, err := f.s.auth.Authenticate(ctx, secret)
		require.NoError(t, err)
		a := f.uncertainOp(t, f.pA, "api-bulk-1")
		b := f.uncertainOp(t, f.pA, "api-bulk-2")
		body := map[string]any{"job_id": "nightly-2026-12-02", "status": "failed", "note": "PSP export: declined",
			"operation_ids": []string{a.OperationID, b.OperationID}}
		res := api.do("POST", "/v1/reconciliations", body)
		require.Equal(t, http.StatusCreated, res.status, res.raw)
		require.Equal(t, "api:"+p.Prefix, res.body["actor"])
		require.Equal(t, "completed", res.body["status"])
		require.EqualValues(t, 2, res.body["done"])
		id := res.body["id"]
		again := api.do("POST", "/v1/reconciliations", body)
		require.Equal(t, http.StatusOK, again.status, again.raw)
		require.Equal(t, id, again.body["id"])
		require.Equal(t, res.body["results"], again.body["results"])
		d := f.opDetail(t, f.pA, a.OperationID)
		require.Equal(t, services.StateFailed, d.State)
		require.Equal(t, "api:"+p.Prefix, d.Outcome.RecordedBy)

		body["note"] = "something else"
		reused := api.do("POST", "/v1/reconciliations", body)
		require.Equal(t, http.StatusConflict, reused.status, reused.raw)
		require.Equal(t, "job_id_reused", reused.body["code"])

		// By filter: only uncertain operations before the given time; none here.
		byFilter := api.do("POST", "/v1/reconciliations", map[string]any{"job_id": "f", "status": "succeeded", "note": "n",
			"filter": map[string]any{"uncertain_before": "2000-01-01T00:00:00Z"}})
		require.Equal(t, http.StatusCreated, byFilter.status, byFilter.raw)
		require.Equal(t, "filter", byFilter.body["selection"])
		require.Empty(t, byFilter.body["results"])

		sentinel := f.uncertainOp(t, f.pA, "api-bulk-3")
		for _, c := range []struct {
			body  string
			field string
		}{
			{`{"status":"failed","note":"n","operation_ids":["` + a.OperationID + `"]}`, "job_id"},
			{`{"job_id":"x y","status":"failed","note":"n","operation_ids":["` + a.OperationID + `"]}`, "job_id"},
			{`{"job_id":"j","status":"released","note":"n","operation_ids":["` + a.OperationID + `"]}`, "status"},
			{`{"job_id":"j","status":"failed","note":"","operation_ids":["` + a.OperationID + `"]}`, "note"},
			{`{"job_id":"j","status":"failed","note":"n"}`, "operation_ids"},
			{`{"job_id":"j","status":"failed","note":"n","operation_ids":["nope"]}`, "operation_ids"},
			{`{"job_id":"j","status":"failed","note":"n","filter":{"reason":"X"}}`, "filter.reason"},
			// A misspelt or unknown filter member was dropped, and the job then reconciled
			// every uncertain operation of the tenant (found by a break-it trial).
			{`{"job_id":"j","status":"failed","note":"n","filter":{"uncertain_befor":"2000-01-01T00:00:00Z"}}`, "filter.uncertain_befor"},
			{`{"job_id":"j","status":"failed","note":"n","filter":{"tenant":"other"}}`, "filter.tenant"},
			{`{"job_id":"j","status":"failed","note":"n","filter":{"reason":"a","reason":"b"}}`, "filter.reason"},
			{`{"job_id":"j","status":"failed","note":"n","filter":{"reason":7}}`, "filter.reason"},
			{`{"job_id":"j","status":"failed","note":"n","filter":{"uncertain_before":"yesterday"}}`, "filter.uncertain_before"},
			{`{"job_id":"j","status":"failed","note":"n","filter":"all"}`, "filter"},
		} {
			r := api.do("POST", "/v1/reconciliations", c.body)
			require.Equal(t, http.StatusBadRequest, r.status, c.body)
			require.Contains(t, r.raw, `"`+c.field+`"`, c.body)
		}
		require.Equal(t, services.StateUncertain, f.opDetail(t, f.pA, sentinel.OperationID).State,
			"no refused request reconciled anything")
		r := api.do("POST", "/v1/reconciliations", `{"job_id":"j","status":"failed","note":"n","filter":{},"extra":1}`)
		require.Equal(t, http.StatusBadRequest, r.status, r.raw)
	})
}

// TestReconciliationsAPIConcurrent: 20 identical requests at once over HTTP make one job; one
// answers 201, the others 200, all with the same results, and each operation has one event.
func TestReconciliationsAPIConcurrent(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		secret, err := f.s.accounts.CreateAPIKey(context.Background(), services.Installation(), f.tenantA, "bulk-c", "")
		require.NoError(t, err)
		var ids []string
		for i := range 5 {
			ids = append(ids, f.uncertainOp(t, f.pA, fmt.Sprintf("api-bulk-c%d", i)).OperationID)
		}
		body := map[string]any{"job_id": "dup", "status": "succeeded", "note": "confirmed", "operation_ids": ids}
		const n = 20
		res := make([]apiResult, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res[i] = (&apiClient{t: t, s: f.s, key: secret}).do("POST", "/v1/reconciliations", body)
			}()
		}
		wg.Wait()
		created := 0
		for _, r := range res {
			require.Contains(t, []int{http.StatusOK, http.StatusCreated}, r.status, r.raw)
			if r.status == http.StatusCreated {
				created++
			}
			require.Equal(t, res[0].body["id"], r.body["id"])
			require.EqualValues(t, 5, r.body["done"])
		}
		require.Equal(t, 1, created)
		for _, id := range ids {
			d := f.opDetail(t, f.pA, id)
			n := 0
			for _, e := range d.Events {
				if e.Kind == services.EventOutcome && strings.HasPrefix(e.Detail, "uncertain -> ") {
					n++
				}
			}
			require.Equal(t, 1, n, "one reconciling event for %s", id)
		}
	})
}

// TestDashboardBulkReconcile: the queue's bulk form reconciles the selected rows as one job
// recorded as the operator; the job page lists done and skipped; submitting the same form again
// lands on the same job; "all matching the filter" takes every page; auditors are refused.
func TestDashboardBulkReconcile(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		one := f.uncertainOp(t, f.pA, "dash-bulk-1")
		two := f.uncertainOp(t, f.pA, "dash-bulk-2")
		three := f.uncertainOp(t, f.pA, "dash-bulk-3")

		page := b.get("/reconciliation")
		form := page.testid("bulk-form")
		require.Equal(t, 1, form.Length())
		require.Equal(t, 3, page.testid("queue-select").Length())
		token := page.doc.Find(`input[form="bulk-form"][name="job_id"]`).AttrOr("value", "")
		require.NotEmpty(t, token)
		require.NotEqual(t, token, b.get("/reconciliation").doc.Find(`input[form="bulk-form"][name="job_id"]`).AttrOr("value", ""),
			"each rendering is a new job")

		// Meanwhile, two is reconciled by hand: the job skips it.
		_, err := f.s.recon.ReconcileOutcome(context.Background(), &services.OperatorAccount{Username: "someone", Role: services.RoleOperator,
			TenantID: &f.pA.TenantID}, two.OperationID, services.ReconcileInput{Status: services.StateSucceeded, Note: "by hand"})
		require.NoError(t, err)
		submit := url.Values{"_csrf": {page.csrf(t)}, "job_id": {token}, "scope": {"selected"}, "status": {"failed"},
			"note": {"bank says no"}, "operation_ids": {one.OperationID, two.OperationID}}
		res := b.post("/reconciliation/jobs", submit)
		require.Equal(t, http.StatusSeeOther, res.status, res.body)
		loc := res.header.Get("Location")
		require.True(t, strings.HasPrefix(loc, "/reconciliation/jobs/"), loc)
		job := b.get(loc)
		require.Equal(t, http.StatusOK, job.status, job.body)
		results := map[string]string{}
		job.testid("job-row").Each(func(_ int, s *goquery.Selection) {
			results[s.AttrOr("data-operation-id", "")] = s.AttrOr("data-result", "")
		})
		require.Equal(t, map[string]string{one.OperationID: "done", two.OperationID: "skipped"}, results)
		require.Contains(t, job.testid("job-row").Last().Text(), "no longer uncertain")
		// The page names the job by the caller's job_id and each operation by its key, not by
		// internal ids (issue 28 item 12).
		require.Equal(t, token, strings.TrimSpace(job.testid("job-id").Text()))
		keys := []string{}
		job.testid("job-key").Each(func(_ int, s *goquery.Selection) { keys = append(keys, strings.TrimSpace(s.Text())) })
		require.Equal(t, []string{one.Key, two.Key}, keys)
		require.Equal(t, f.restricted, strings.TrimSpace(job.testid("job-actor").Text()))
		require.Equal(t, f.restricted, f.opDetail(t, f.pA, one.OperationID).Outcome.RecordedBy)

		// The same form again: the same job, nothing twice.
		res = b.post("/reconciliation/jobs", submit)
		require.Equal(t, loc, res.header.Get("Location"))
		// Nothing selected: refused, naming what to do.
		res = b.post("/reconciliation/jobs", url.Values{"_csrf": {page.csrf(t)}, "job_id": {"form-x"}, "scope": {"selected"},
			"status": {"failed"}, "note": {"n"}})
		require.Equal(t, http.StatusBadRequest, res.status)
		require.Contains(t, res.testid("error-message").Text(), "select at least one operation")

		// Every operation matching the filter: three is the only one left.
		res = b.post("/reconciliation/jobs", url.Values{"_csrf": {page.csrf(t)}, "job_id": {"form-all"}, "scope": {"filter"},
			"status": {"succeeded"}, "note": {"all good"}, "before": {"2999-01-01T00:00"}})
		require.Equal(t, http.StatusSeeOther, res.status, res.body)
		all := b.get(res.header.Get("Location"))
		require.Equal(t, 1, all.testid("job-row").Length())
		require.Equal(t, three.OperationID, all.testid("job-row").AttrOr("data-operation-id", ""))
		require.Equal(t, 1, b.get("/reconciliation").testid("queue-empty").Length())

		// Another tenant's restricted account does not see the job; auditors may not submit.
		other := newDashBrowser(t, f.s)
		other.mustLogin(dashOperator(t, f.db, services.RoleOperator, &f.pB.TenantID))
		require.Equal(t, http.StatusNotFound, other.get(loc).status)
		aud := newDashBrowser(t, f.s)
		aud.mustLogin(f.global)
		q := aud.get("/reconciliation")
		require.Zero(t, q.testid("bulk-form").Length(), "no bulk form for auditors")
		res = aud.post("/reconciliation/jobs", url.Values{"_csrf": {q.csrf(t)}, "job_id": {"a"}, "scope": {"filter"},
			"status": {"failed"}, "note": {"n"}})
		require.Equal(t, http.StatusForbidden, res.status)
	})
}

// FuzzDecodeReconciliation: whatever the body, decoding a POST /v1/reconciliations body either
// refuses it as invalid_request or yields a filter only from members it knows; a filter
// member it does not know is never dropped silently.
func FuzzDecodeReconciliation(f *testing.F) {
	for _, s := range []string{
		`{"job_id":"j","status":"failed","note":"n","operation_ids":["0b6e4a3c-7f5e-4b8e-9f7a-1c2d3e4f5a6b"]}`,
		`{"job_id":"j","status":"failed","note":"n","filter":{"reason":"ttl_expired_without_outcome"}}`,
		`{"job_id":"j","status":"failed","note":"n","filter":{"uncertain_before":"2026-12-01T00:00:00Z"}}`,
		`{"job_id":"j","status":"failed","note":"n","filter":{"uncertain_befor":"x"}}`,
		`{"job_id":"j","status":"failed","note":"n","filter":null}`,
		`{"job_id":"j","status":"failed","note":"n","filter":[]}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		in, err := decodeReconciliation([]byte(body))
		if err != nil {
			var se *services.Error
			if !errors.As(err, &se) || se.Code != services.CodeInvalidRequest {
				t.Fatalf("refused with %v, want invalid_request", err)
			}
			return
		}
		var raw struct {
			Filter map[string]json.RawMessage `json:"filter"`
		}
		if json.Unmarshal([]byte(body), &raw) == nil {
			for name := range raw.Filter {
				if name != "reason" && name != "uncertain_before" {
					t.Fatalf("filter member %q accepted: %+v", name, in.Filter)
				}
			}
		}
	})
}
