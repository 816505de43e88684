package web

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// adminKeyRow is the API-key row of tenant on the admin page, or nil.
func adminKeyRow(p dashPage, tenant string) *goquery.Selection {
	var row *goquery.Selection
	p.testid("apikey-row").Each(func(_ int, s *goquery.Selection) {
		if opSelText(s.Find(`[data-testid="apikey-tenant"]`)) == tenant {
			row = s
		}
	})
	return row
}

// adminOperatorRow is the row of username on the admin page, or nil.
func adminOperatorRow(p dashPage, username string) *goquery.Selection {
	var row *goquery.Selection
	p.testid("operator-row").Each(func(_ int, s *goquery.Selection) {
		if strings.Fields(s.Find(`[data-testid="operator-username"]`).Text())[0] == username {
			row = s
		}
	})
	return row
}

// formAction is the action of the form around the element with data-testid id in row.
func formAction(t *testing.T, row *goquery.Selection, id string) string {
	t.Helper()
	require.NotNil(t, row)
	a, ok := row.Find(`[data-testid="` + id + `"]`).Closest("form").Attr("action")
	require.True(t, ok, "no form around %s", id)
	return a
}

func TestDashboardAdminAPIKeys(t *testing.T) {
	t.Parallel()
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		s, other := newTestServer(t, db), newTestServer(t, db) // two instances, one database
		admin := dashOperator(t, db, services.RoleAdmin, nil)
		b := newDashBrowser(t, s)
		b.mustLogin(admin)

		page := b.get("/admin")
		require.Equal(t, http.StatusOK, page.status, page.body)
		requirePageHeaders(t, page)
		require.Equal(t, "page", page.testid("nav-admin").AttrOr("aria-current", ""))
		require.Equal(t, 1, page.testid("admin-apikeys").Length())
		require.Equal(t, 0, page.testid("new-secret").Length())

		tenant, label := "adm-"+dashRandom(), `worker <b>1</b>`
		res := b.post("/admin/api-keys", url.Values{"tenant": {tenant}, "label": {label}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusOK, res.status, res.body)
		requirePageHeaders(t, res) // no-store: the secret is in this answer only
		secret := opSelText(res.testid("new-secret"))
		require.Empty(t, services.ValidateAPIKeySecret(secret))
		require.Contains(t, res.body, "it is not shown again")
		require.NotContains(t, res.header.Get("Location"), secret)
		for _, c := range res.setCookies {
			require.NotContains(t, c.Value, secret)
		}

		// The secret works on both instances; each caches it.
		c1, c2 := &apiClient{t: t, s: s, key: secret}, &apiClient{t: t, s: other, key: secret}
		require.Equal(t, http.StatusCreated, acquire(c1, "admin-k1", nil).status)
		require.Equal(t, http.StatusCreated, acquire(c2, "admin-k2", nil).status)

		// The listing shows prefix, tenant and label, and never the secret again.
		page = b.get("/admin")
		require.NotContains(t, page.body, secret)
		require.NotContains(t, page.body, "<b>1</b>")
		row := adminKeyRow(page, tenant)
		require.NotNil(t, row, "no row for %s", tenant)
		require.Equal(t, secret[:12]+"…", opSelText(row.Find(`[data-testid="apikey-prefix"]`)))
		require.Equal(t, label, opSelText(row.Find(`[data-testid="apikey-label"]`)))
		require.NotEmpty(t, opSelText(row.Find(`[data-testid="apikey-created"]`)))
		require.Equal(t, "Active", opSelText(row.Find(`[data-testid="apikey-status"]`)))
		action := formAction(t, row, "apikey-revoke")

		// Without the confirmation nothing happens.
		res = b.post(action, url.Values{"_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusBadRequest, res.status)
		require.Contains(t, opSelText(res.testid("action-error")), "tick the confirmation box")
		require.Equal(t, http.StatusOK, acquire(c1, "admin-k1", nil).status, "still accepted (a duplicate)")

		res = b.post(action, url.Values{"confirm": {"yes"}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusSeeOther, res.status, res.body)
		require.Equal(t, "/admin?done=revoked", res.header.Get("Location"))
		revoked := time.Now()
		require.Equal(t, http.StatusUnauthorized, acquire(c1, "admin-k3", nil).status, "refused at once where revoked")
		// The other instance refuses it within its cache bound.
		for acquire(c2, "admin-k4", nil).status != http.StatusUnauthorized {
			require.Less(t, time.Since(revoked), services.CacheTTL+500*time.Millisecond, "revoked key still accepted")
			time.Sleep(20 * time.Millisecond)
		}

		page = b.get(res.header.Get("Location"))
		require.Contains(t, opSelText(page.testid("flash")), "API key revoked.")
		row = adminKeyRow(page, tenant)
		require.True(t, strings.HasPrefix(opSelText(row.Find(`[data-testid="apikey-status"]`)), "Revoked"))
		require.Equal(t, 0, row.Find(`[data-testid="apikey-revoke"]`).Length())
		require.NotEmpty(t, opSelText(row.Find(`[data-testid="apikey-last-used"] time`)), "last used is recorded")

		// Revoking again is a 404 with the page, and a bad tenant name is refused.
		res = b.post(action, url.Values{"confirm": {"yes"}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusNotFound, res.status)
		require.Contains(t, opSelText(res.testid("action-error")), "Not revoked")
		res = b.post("/admin/api-keys", url.Values{"tenant": {"no spaces allowed"}, "label": {"x"}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusBadRequest, res.status)
		require.Contains(t, opSelText(res.testid("action-error")), "Tenant")
		require.Equal(t, 0, res.testid("new-secret").Length())
	})
}

func TestDashboardAdminOperators(t *testing.T) {
	t.Parallel()
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		s := newTestServer(t, db)
		admin := dashOperator(t, db, services.RoleAdmin, nil)
		b := newDashBrowser(t, s)
		b.mustLogin(admin)
		page := b.get("/admin")
		require.Equal(t, 1, page.testid("admin-operators").Length())
		require.Equal(t, 1, page.testid("operator-create").Length())

		name, password := "adm-op-"+dashRandom(), "a-long-password-1"
		res := b.post("/admin/operators", url.Values{"username": {name}, "role": {"operator"}, "password": {"shortpw1"},
			"_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusBadRequest, res.status)
		require.Contains(t, opSelText(res.testid("action-error")), "Password")
		require.Equal(t, name, res.doc.Find(`#o-username`).AttrOr("value", ""), "typed values are kept")
		require.NotContains(t, res.body, "shortpw1", "never the password")

		res = b.post("/admin/operators", url.Values{"username": {name}, "role": {"operator"}, "tenant": {""},
			"password": {password}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusSeeOther, res.status, res.body)
		page = b.get(res.header.Get("Location"))
		require.Equal(t, "Operator account created.", opSelText(page.testid("flash")))
		row := adminOperatorRow(page, name)
		require.NotNil(t, row)
		require.Equal(t, "operator", row.Find(`[data-testid="operator-role"] option[selected]`).AttrOr("value", ""))
		require.Equal(t, "all tenants", opSelText(row.Find(`[data-testid="operator-tenant"]`)))

		// The new account signs in; it is no admin.
		other := newDashBrowser(t, s)
		other.mustLogin2(name, password)
		keys := other.get("/keys")
		require.Equal(t, http.StatusOK, keys.status)
		require.Equal(t, 0, keys.testid("nav-admin").Length())
		require.Equal(t, http.StatusForbidden, other.get("/admin").status)

		// Made an admin, it may administer at its next request.
		res = b.post(formAction(t, row, "operator-save"), url.Values{"role": {"admin"}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusSeeOther, res.status, res.body)
		require.Equal(t, "/admin?done=role", res.header.Get("Location"))
		require.Equal(t, http.StatusOK, other.get("/admin").status)
		page = b.get("/admin")
		row = adminOperatorRow(page, name)
		require.Equal(t, "admin", row.Find(`[data-testid="operator-role"] option[selected]`).AttrOr("value", ""))

		res = b.post(formAction(t, row, "operator-save"), url.Values{"role": {"root"}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusBadRequest, res.status)
		require.Contains(t, opSelText(res.testid("action-error")), "Role")

		// Delete: confirmation required; then its session ends at its next request.
		res = b.post(formAction(t, row, "operator-delete"), url.Values{"_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusBadRequest, res.status)
		require.Equal(t, http.StatusOK, other.get("/keys").status)
		res = b.post(formAction(t, row, "operator-delete"), url.Values{"confirm": {"yes"}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusSeeOther, res.status, res.body)
		page = b.get(res.header.Get("Location"))
		require.Contains(t, opSelText(page.testid("flash")), "deleted")
		require.Nil(t, adminOperatorRow(page, name))
		gone := other.get("/keys")
		require.Equal(t, http.StatusSeeOther, gone.status)
		require.True(t, strings.HasPrefix(gone.header.Get("Location"), "/login"))
	})
}

// mustLogin2 signs in with password and asserts it worked.
func (b *dashBrowser) mustLogin2(username, password string) {
	b.t.Helper()
	res := b.login(username, password)
	require.Equal(b.t, http.StatusSeeOther, res.status, res.body)
}

func TestDashboardAdminKeepsLastAdmin(t *testing.T) {
	t.Parallel()
	modeltest.Each(t, modeltest.Fresh(t), func(t *testing.T, db *models.DB) { // the last-admin rule counts every account
		s := newTestServer(t, db)
		root := dashOperator(t, db, services.RoleAdmin, nil)
		b := newDashBrowser(t, s)
		b.mustLogin(root)
		page := b.get("/admin")
		row := adminOperatorRow(page, root)
		require.NotNil(t, row)
		require.Contains(t, opSelText(row.Find(`[data-testid="operator-username"]`)), "(you)")

		res := b.post(formAction(t, row, "operator-save"), url.Values{"role": {"auditor"}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusBadRequest, res.status, res.body)
		require.Contains(t, opSelText(res.testid("action-error")), "last global admin")
		res = b.post(formAction(t, row, "operator-delete"), url.Values{"confirm": {"yes"}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusBadRequest, res.status, res.body)
		require.Contains(t, opSelText(res.testid("action-error")), "last global admin")

		page = b.get("/admin")
		require.Equal(t, http.StatusOK, page.status, "still an admin")
		require.Equal(t, "admin", adminOperatorRow(page, root).Find(`[data-testid="operator-role"] option[selected]`).AttrOr("value", ""))
	})
}

func TestDashboardAdminForbidden(t *testing.T) {
	t.Parallel()
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		ctx := context.Background()
		target := dashOperator(t, f.db, services.RoleOperator, nil)
		var targetOp models.Operator
		require.NoError(t, f.db.Where("username = ?", target).Take(&targetOp).Error)
		targetPath := "/admin/operators/" + strconv.FormatInt(targetOp.ID, 10)
		posts := map[string]url.Values{
			"/admin/api-keys": {"tenant": {"forbidden-" + dashRandom()}, "label": {"x"}},
			"/admin/api-keys/" + strconv.FormatInt(f.pA.APIKeyID, 10) + "/revoke": {"confirm": {"yes"}},
			"/admin/operators":     {"username": {"evil-" + dashRandom()}, "role": {"admin"}, "password": {"a-long-password-1"}},
			targetPath + "/role":   {"role": {"admin"}},
			targetPath + "/delete": {"confirm": {"yes"}},
		}
		for _, who := range []string{
			dashOperator(t, f.db, services.RoleOperator, nil),
			dashOperator(t, f.db, services.RoleAuditor, nil),
			dashOperator(t, f.db, services.RoleAdmin, &f.pA.TenantID), // a tenant's admin manages nothing global
		} {
			b := newDashBrowser(t, f.s)
			b.mustLogin(who)
			keys := b.get("/keys")
			require.Equal(t, 0, keys.testid("nav-admin").Length(), "no Admin link for %s", who)
			require.Equal(t, http.StatusForbidden, b.get("/admin").status)
			for path, form := range posts {
				form.Set("_csrf", keys.csrf(t)) // a valid token: only the role check stops it
				res := b.post(path, form)
				require.Equal(t, http.StatusForbidden, res.status, "%s by %s", path, who)
				require.Equal(t, "403", res.testid("error-status").Text())
			}
		}
		// Nothing changed.
		got, err := f.s.auth.Operator(ctx, targetOp.ID)
		require.NoError(t, err)
		require.Equal(t, services.RoleOperator, got.Role)
		var n int64
		require.NoError(t, f.db.Model(&models.APIKey{}).Where("id = ? AND revoked_at IS NULL", f.pA.APIKeyID).Count(&n).Error)
		require.EqualValues(t, 1, n, "the key is not revoked")
		require.NoError(t, f.db.Model(&models.Tenant{}).Where("name = ?", posts["/admin/api-keys"].Get("tenant")).Count(&n).Error)
		require.Zero(t, n)
		require.NoError(t, f.db.Model(&models.Operator{}).Where("username = ?", posts["/admin/operators"].Get("username")).Count(&n).Error)
		require.Zero(t, n)

		// A global admin does see the link.
		admin := newDashBrowser(t, f.s)
		admin.mustLogin(dashOperator(t, f.db, services.RoleAdmin, nil))
		require.Equal(t, 1, admin.get("/keys").testid("nav-admin").Length())
	})
}

func TestDashboardAdminRequiresCSRF(t *testing.T) {
	t.Parallel()
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		b := newDashBrowser(t, f.s)
		b.mustLogin(dashOperator(t, f.db, services.RoleAdmin, nil))
		require.Equal(t, http.StatusOK, b.get("/admin").status)
		tenant := "csrf-" + dashRandom()
		for _, token := range []string{"", "not-the-token"} {
			form := url.Values{"tenant": {tenant}, "label": {"x"}}
			if token != "" {
				form.Set("_csrf", token)
			}
			res := b.post("/admin/api-keys", form)
			require.Equal(t, http.StatusForbidden, res.status)
			require.Equal(t, 0, res.testid("new-secret").Length())
			res = b.post("/admin/api-keys/"+strconv.FormatInt(f.pA.APIKeyID, 10)+"/revoke", url.Values{"confirm": {"yes"}, "_csrf": {token}})
			require.Equal(t, http.StatusForbidden, res.status)
		}
		var n int64
		require.NoError(t, f.db.Model(&models.Tenant{}).Where("name = ?", tenant).Count(&n).Error)
		require.Zero(t, n)
		require.NoError(t, f.db.Model(&models.APIKey{}).Where("id = ? AND revoked_at IS NULL", f.pA.APIKeyID).Count(&n).Error)
		require.EqualValues(t, 1, n)
	})
}

// TestDashboardAdminTenantChoice: the API key form offers the existing tenants in a select; a
// new tenant's name that differs from an existing one only by letter case is refused, naming
// the existing tenant, and nothing is created; choosing it from the list works.
func TestDashboardAdminTenantChoice(t *testing.T) {
	dbs.Each(t, func(t *testing.T, db *models.DB) {
		s := newTestServer(t, db)
		b := newDashBrowser(t, s)
		b.mustLogin(dashOperator(t, db, services.RoleAdmin, nil))
		shop := "shop-" + dashRandom()
		page := b.get("/admin")
		res := b.post("/admin/api-keys", url.Values{"new_tenant": {shop}, "label": {"first"}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusOK, res.status, res.body)
		require.Equal(t, 1, res.testid("new-secret").Length())

		page = b.get("/admin")
		require.Equal(t, 1, page.testid("apikey-tenant-select").Find(`option[value="`+shop+`"]`).Length(), "the tenant is offered")
		typo := strings.ToUpper(shop[:1]) + shop[1:]
		res = b.post("/admin/api-keys", url.Values{"tenant": {""}, "new_tenant": {typo + " "}, "label": {"typo"}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusBadRequest, res.status)
		msg := opSelText(res.testid("action-error"))
		require.Contains(t, msg, "only by letter case")
		require.Contains(t, msg, shop)
		require.Equal(t, 0, res.testid("new-secret").Length())
		var n int64
		require.NoError(t, db.Model(&models.Tenant{}).Where("name = ?", typo).Count(&n).Error)
		require.Zero(t, n, "no tenant from the typo")

		res = b.post("/admin/api-keys", url.Values{"tenant": {""}, "new_tenant": {""}, "label": {"x"}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusBadRequest, res.status)
		require.Contains(t, opSelText(res.testid("action-error")), "choose a tenant")

		res = b.post("/admin/api-keys", url.Values{"tenant": {shop}, "label": {"second"}, "_csrf": {page.csrf(t)}})
		require.Equal(t, http.StatusOK, res.status, res.body)
		require.Equal(t, 1, res.testid("new-secret").Length())
	})
}
