package web

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"
	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// TestDashboardAdminPolicies: a global admin sets a policy on the admin page and the instance's
// next acquire takes it; a refused form names the fields and keeps what was typed; delete asks
// for confirmation; a tenant-restricted admin gets no admin page (and the isolation matrix
// shows its posts refused).
func TestDashboardAdminPolicies(t *testing.T) {
	t.Parallel()
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		s := newTestServer(t, db)
		c := newTenantClient(t, s)
		tenant := principalOf(t, s, c).TenantName
		b := newDashBrowser(t, s)
		b.mustLogin(dashOperator(t, db, services.RoleAdmin, nil))

		page := b.get("/admin")
		require.Equal(t, http.StatusOK, page.status, page.body)
		require.Equal(t, 1, page.testid("admin-policies").Length())
		// The package's database is shared: only this test's tenant's rows are its own.
		mine := func(p dashPage) *goquery.Selection {
			return p.testid("policy-row").FilterFunction(func(_ int, r *goquery.Selection) bool {
				return strings.TrimSpace(r.Find(`[data-testid="policy-tenant"]`).Text()) == tenant
			})
		}
		require.Equal(t, 0, mine(page).Length())

		res := b.post("/admin/policies", url.Values{"tenant": {tenant}, "operation": {"charge"}, "ttl": {"soon"},
			"retention": {"30d"}, "horizon": {"1d"}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusBadRequest, res.status, res.body)
		require.Contains(t, res.body, "ttl")
		require.Equal(t, "soon", res.doc.Find("#p-ttl").AttrOr("value", ""), "what was typed is kept")
		res = b.post("/admin/policies", url.Values{"tenant": {tenant}, "operation": {"charge"}, "ttl": {"1h"},
			"retention": {"30d"}, "horizon": {"1d"}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusBadRequest, res.status, res.body)
		require.Contains(t, res.body, "must not be shorter than retention")

		res = b.post("/admin/policies", url.Values{"tenant": {tenant}, "operation": {"charge"}, "ttl": {"1h"},
			"on_expiry": {"hold_until_reconciled"}, "retention": {"30d"}, "horizon": {"400d"}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusSeeOther, res.status, res.body)
		page = b.get(res.header.Get("Location"))
		require.Contains(t, page.body, "Policy set.")
		row := mine(page)
		require.Equal(t, 1, row.Length())
		cell := func(id string) string { return strings.TrimSpace(row.Find(`[data-testid="` + id + `"]`).Text()) }
		require.Equal(t, "1h", cell("policy-ttl"))
		require.Equal(t, "30d", cell("policy-retention"))
		require.Equal(t, "400d", cell("policy-horizon"))
		require.Equal(t, "hold_until_reconciled", cell("policy-on-expiry"))

		res2 := c.do("POST", "/v1/acquire", map[string]any{"key": "admin-policy", "operation": "charge"})
		require.Equal(t, http.StatusCreated, res2.status, res2.raw)
		require.EqualValues(t, 30*24*3600, res2.body["retention_seconds"])
		require.EqualValues(t, 400*24*3600, res2.body["horizon_seconds"])

		res = b.post("/admin/policies/delete", url.Values{"tenant": {tenant}, "operation": {"charge"}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusBadRequest, res.status, "no confirmation, nothing deleted")
		res = b.post("/admin/policies/delete", url.Values{"tenant": {tenant}, "operation": {"charge"}, "confirm": {"yes"},
			"_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusSeeOther, res.status, res.body)
		list, err := s.policies.List(context.Background(), tenant)
		require.NoError(t, err)
		require.Empty(t, list)

		restricted := newDashBrowser(t, s)
		tenantID := principalOf(t, s, c).TenantID
		restricted.mustLogin(dashOperator(t, db, services.RoleAdmin, &tenantID))
		page = restricted.get("/admin")
		require.Equal(t, http.StatusForbidden, page.status, "the admin page, policies included, is global admins'")
	})
}
