package web

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// TestDashboardWebhooks: a global admin adds an endpoint (tenant from a list, the secret shown
// once), disables, enables and deletes it; the delivery log shows each delivery's status,
// attempts, last HTTP status and error, links the operation, and shows a restricted account
// only its own tenant's deliveries; the overview shows the oldest uncertain age.
func TestDashboardWebhooks(t *testing.T) {
	t.Parallel()
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("receiver down for maintenance"))
		}))
		defer rc.Close()
		admin := dashOperator(t, f.db, services.RoleAdmin, nil)
		b := newDashBrowser(t, f.s)
		b.mustLogin(admin)

		page := b.get("/admin")
		require.Equal(t, http.StatusOK, page.status, page.body)
		require.Equal(t, 1, page.testid("admin-webhooks").Length())
		opts := page.doc.Find(`#w-tenant option`).Map(func(_ int, s2 *goquery.Selection) string { return s2.AttrOr("value", "") })
		require.Contains(t, opts, f.tenantA, "tenants are chosen from a list")

		bad := b.post("/admin/webhooks", url.Values{"tenant": {f.tenantA}, "url": {"http://example.com/h"},
			"_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusBadRequest, bad.status, bad.body)
		msg := opSelText(bad.testid("action-error"))
		require.Contains(t, msg, "URL")
		require.Contains(t, msg, "Events")

		res := b.post("/admin/webhooks", url.Values{"tenant": {f.tenantA}, "url": {rc.URL + "/hook"},
			"events": {services.EventOperationUncertain, services.EventOperationReconciled}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusOK, res.status, res.body)
		requirePageHeaders(t, res)
		secret := opSelText(res.testid("new-webhook-secret"))
		require.True(t, strings.HasPrefix(secret, "whsec_"), secret)
		copyText, ok := res.testid("new-webhook-secret").Attr("data-copy")
		require.True(t, ok, "the secret has a copy button (static/app.js adds it from data-copy)")
		require.Equal(t, secret, copyText)
		// Shown once, so shown first: right under the banner, before every section (issue 28).
		secretAt := strings.Index(res.body, `data-testid="new-webhook-secret"`)
		require.Less(t, strings.Index(res.body, `data-testid="flash"`), secretAt)
		require.Less(t, secretAt, strings.Index(res.body, `class="card admin-section"`))

		// Other tests share the database and add endpoints too: this test's row is found by
		// its URL, never by position (a parallel test's newer endpoint was first, and this
		// test deleted it).
		myRow := func(p dashPage) *goquery.Selection {
			return p.testid("webhook-row").FilterFunction(func(_ int, s *goquery.Selection) bool {
				return opSelText(s.Find(`[data-testid="webhook-url"]`)) == rc.URL+"/hook"
			})
		}
		page = b.get("/admin")
		require.NotContains(t, page.body, secret, "shown once")
		require.NotContains(t, page.body, "whsec_")
		row := myRow(page)
		require.Equal(t, 1, row.Length())
		require.Equal(t, rc.URL+"/hook", opSelText(row.Find(`[data-testid="webhook-url"]`)))
		require.Equal(t, "active", opSelText(row.Find(`[data-testid="webhook-status"]`)))
		toggle := formAction(t, row, "webhook-toggle")
		res = b.post(toggle, url.Values{"_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusSeeOther, res.status, res.body)
		page = b.get("/admin")
		require.Equal(t, "disabled", opSelText(myRow(page).Find(`[data-testid="webhook-status"]`)))
		res = b.post(formAction(t, myRow(page), "webhook-toggle"), url.Values{"_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusSeeOther, res.status, res.body)

		// An uncertain operation of tenant A, one failed attempt.
		a := f.acquire(t, f.pA, "hook-"+dashRandom())
		_, err := f.s.adm.RecordOutcome(context.Background(), f.pA, a.OperationID,
			services.OutcomeInput{OwnerToken: a.OwnerToken, Status: services.StateUncertain})
		require.NoError(t, err)
		// Other tests share the database and may have deliveries due too: run until ours was tried.
		d := services.NewDispatcher(f.db, slog.New(slog.DiscardHandler), services.DispatcherConfig{Timeout: time.Second})
		require.Eventually(t, func() bool {
			_, err := d.RunOnce(context.Background())
			require.NoError(t, err)
			var ev models.WebhookEvent
			require.NoError(t, f.db.Where("operation_id = ?", a.OperationID).Take(&ev).Error)
			return ev.Attempts == 1
		}, 20*time.Second, 10*time.Millisecond)

		log := b.get("/webhooks")
		require.Equal(t, http.StatusOK, log.status, log.body)
		requirePageHeaders(t, log)
		var mine *goquery.Selection
		log.testid("delivery-row").Each(func(_ int, s2 *goquery.Selection) {
			if opSelText(s2.Find(`[data-testid="delivery-operation"]`)) == a.OperationID {
				mine = s2
			}
		})
		require.NotNil(t, mine, "the delivery is listed")
		require.Equal(t, services.EventOperationUncertain, opSelText(mine.Find(`[data-testid="delivery-event"]`)))
		require.Equal(t, "pending", opSelText(mine.Find(`[data-testid="delivery-status"]`)))
		require.Equal(t, "1", opSelText(mine.Find(`[data-testid="delivery-attempts"]`)))
		require.Equal(t, "503", opSelText(mine.Find(`[data-testid="delivery-last-status"]`)))
		require.Contains(t, opSelText(mine.Find(`[data-testid="delivery-last-error"]`)), "receiver down for maintenance")
		require.NotEmpty(t, opSelText(mine.Find(`[data-testid="delivery-next"]`)))
		require.Equal(t, "/operations/"+a.OperationID, mine.Find(`[data-testid="delivery-operation"]`).AttrOr("href", ""))

		require.NotContains(t, b.get("/webhooks?status=delivered").body, a.OperationID, "filtered by status")
		require.Contains(t, b.get("/webhooks?status=pending").body, a.OperationID)
		require.Equal(t, http.StatusBadRequest, b.get("/webhooks?status=lost").status)

		// Restricted accounts: tenant A's sees it, tenant B's does not.
		ra := newDashBrowser(t, f.s)
		ra.mustLogin(f.restricted)
		require.Contains(t, ra.get("/webhooks").body, a.OperationID)
		rb := newDashBrowser(t, f.s)
		rb.mustLogin(dashOperator(t, f.db, services.RoleAuditor, &f.pB.TenantID))
		other := rb.get("/webhooks")
		require.Equal(t, http.StatusOK, other.status)
		require.NotContains(t, other.body, a.OperationID)
		require.Equal(t, http.StatusForbidden, rb.post("/admin/webhooks", url.Values{"_csrf": {other.csrf(t)}}).status)

		// The overview says how long the oldest uncertain operation has waited.
		ov := ra.get("/")
		require.Contains(t, opSelText(ov.testid("overview-oldest-uncertain")), "Oldest uncertain:")

		page = b.get("/admin")
		del := formAction(t, myRow(page), "webhook-delete")
		require.Equal(t, http.StatusBadRequest, b.post(del, url.Values{"_csrf": {page.csrf(t)}}).status, "confirmation required")
		require.Equal(t, http.StatusSeeOther, b.post(del, url.Values{"_csrf": {page.csrf(t)}, "confirm": {"yes"}}).status)
		page = b.get("/admin")
		require.NotContains(t, page.body, rc.URL+"/hook")
		require.Contains(t, b.get("/webhooks").body, "endpoint deleted by "+admin)
	})
}
