package web

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// queueGauge reads idemgate_operations_needing_reconciliation for tenant from a fresh
// collector, so no cached count of an earlier step is reused.
func queueGauge(t *testing.T, s *Server, tenant string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(newReconciliationCollector(s.dash.NeedsReconciliationByTenant, slog.New(slog.DiscardHandler)))
	fams, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range fams {
		if f.GetName() != "idemgate_operations_needing_reconciliation" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "tenant" && l.GetValue() == tenant {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no gauge for tenant %s", tenant)
	return 0
}

// apiQueue walks GET /v1/operations?state=uncertain one item per page and returns the ids in
// the order served.
func apiQueue(t *testing.T, api *apiClient) []string {
	t.Helper()
	var ids []string
	path := "/v1/operations?state=uncertain&limit=1"
	for range 100 {
		res := api.do("GET", path, nil)
		require.Equal(t, http.StatusOK, res.status, res.raw)
		for _, it := range res.body["items"].([]any) {
			op := it.(map[string]any)
			require.Equal(t, services.StateUncertain, op["state"])
			ids = append(ids, op["id"].(string))
		}
		next, _ := res.body["next_cursor"].(string)
		if next == "" {
			return ids
		}
		path = "/v1/operations?state=uncertain&limit=1&cursor=" + url.QueryEscape(next)
	}
	t.Fatal("the queue did not end")
	return nil
}

// TestReconciliationQueueAgrees: after a takeover (the old operation is superseded, so the
// key's newest operation is not uncertain), a reaper pass and an owner's "uncertain", then
// after reconciliations, the overview's count, the API queue, the dashboard's queue and the
// metric agree, and the queue is ordered by the time each operation became uncertain.
func TestReconciliationQueueAgrees(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		ctx := context.Background()
		secret, err := f.s.accounts.CreateAPIKey(ctx, services.Installation(), f.tenantA, "queue", "")
		require.NoError(t, err)
		api := &apiClient{t: t, s: f.s, key: secret}
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)

		agree := func(t *testing.T, want []string) {
			t.Helper()
			require.Equal(t, want, apiQueue(t, api), "the API queue")
			require.EqualValues(t, len(want), overviewCount(t, b.get("/"), "overview-needs-reconciliation"), "the overview")
			require.EqualValues(t, len(want), queueGauge(t, f.s, f.tenantA), "the metric")
			page := b.get("/reconciliation")
			require.Equal(t, http.StatusOK, page.status, page.body)
			cur, _ := page.testid("nav-reconciliation").Attr("aria-current")
			require.Equal(t, "page", cur, "the navigation marks the queue as the current page")
			var shown []string
			page.testid("queue-row").Each(func(_ int, s *goquery.Selection) {
				id, _ := s.Attr("data-operation-id")
				shown = append(shown, id)
			})
			require.Equal(t, want, shown, "the dashboard queue")
		}
		agree(t, nil)

		taken := f.opAcquire(t, f.pA, "q-taken", 1, "")
		reaped := f.opAcquire(t, f.pA, "q-reaped", 1, "")
		elapse(t, f.db, f.pA, time.Second, "q-taken", "q-reaped")
		f.opAcquire(t, f.pA, "q-taken", 300, "") // takes the expired key over: taken becomes uncertain
		res, err := services.NewReaper(f.db, slog.New(slog.DiscardHandler), 0).RunOnce(ctx)
		require.NoError(t, err)
		require.GreaterOrEqual(t, res.MarkedUncertain, int64(1))
		unsure := f.opAcquire(t, f.pA, "q-unsure", 300, "")
		_, err = f.s.adm.RecordOutcome(ctx, f.pA, unsure.OperationID, services.OutcomeInput{OwnerToken: unsure.OwnerToken,
			Status: services.StateUncertain})
		require.NoError(t, err)

		// The superseded one is not the newest operation of its key: a key listing misses it.
		keys := api.do("GET", "/v1/keys?state=uncertain&limit=500", nil)
		require.Equal(t, http.StatusOK, keys.status)
		require.Len(t, keys.body["items"], 2)
		agree(t, []string{taken.OperationID, reaped.OperationID, unsure.OperationID})
		// Each item carries the queue's sort key and says whether it was superseded.
		all := api.do("GET", "/v1/operations?state=uncertain&limit=500", nil)
		require.Equal(t, http.StatusOK, all.status, all.raw)
		var prev time.Time
		for _, it := range all.body["items"].([]any) {
			op := it.(map[string]any)
			at, err := time.Parse(time.RFC3339Nano, op["uncertain_at"].(string))
			require.NoError(t, err)
			require.False(t, at.Before(prev), "oldest first by uncertain_at: %v", all.raw)
			prev = at
			require.Equal(t, op["id"] == taken.OperationID, op["superseded"], "superseded of %s", op["id"])
		}

		// Reconciliations take operations off the queue, superseded or not.
		_, err = f.s.adm.RecordOutcome(ctx, f.pA, taken.OperationID, services.OutcomeInput{OwnerToken: taken.OwnerToken,
			Status: services.StateSucceeded})
		require.NoError(t, err)
		page := b.get("/operations/" + reaped.OperationID)
		require.Equal(t, http.StatusSeeOther, b.post("/operations/"+reaped.OperationID+"/outcome", url.Values{
			"status": {"failed"}, "note": {"checked the ledger"}, "_csrf": {page.csrf(t)}}).status)
		agree(t, []string{unsure.OperationID})
		// Another tenant's queue stays its own.
		require.Zero(t, queueGauge(t, f.s, f.tenantB))
	})
}

func TestListOperationsValidation(t *testing.T) {
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		s := newTestServer(t, db)
		api := newTenantClient(t, s)
		keyCursor := ""
		for i := range 2 {
			acquire(api, "v-"+string(rune('a'+i)), nil)
		}
		if res := api.do("GET", "/v1/keys?limit=1", nil); res.status == http.StatusOK {
			keyCursor, _ = res.body["next_cursor"].(string)
		}
		require.NotEmpty(t, keyCursor)
		for _, q := range []struct{ query, field string }{
			{"", "state"},
			{"state=failed", "state"},
			{"state=UNCERTAIN", "state"},
			{"state=uncertain&limit=0", "limit"},
			{"state=uncertain&limit=501", "limit"},
			{"state=uncertain&limit=x", "limit"},
			{"state=uncertain&cursor=%25%25", "cursor"},
			{"state=uncertain&cursor=" + url.QueryEscape(keyCursor), "cursor"},
		} {
			res := problemOf(t, api.do("GET", "/v1/operations?"+q.query, nil), http.StatusBadRequest, "invalid_request")
			require.Equal(t, []string{q.field}, fieldNames(res), q.query)
		}
		res := api.do("GET", "/v1/operations?state=uncertain&limit=500", nil)
		require.Equal(t, http.StatusOK, res.status, res.raw)
		require.Empty(t, res.body["items"])
		require.Nil(t, res.body["next_cursor"])
	})
}
