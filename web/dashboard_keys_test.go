package web

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// TestDashboardKeysPrefixExpiringAndLinks covers the Keys page's key-prefix search, the
// "expiring soon" filter, the link from each key to its newest operation, and the htmx
// refresh URL keeping the filters.
func TestDashboardKeysPrefixExpiringAndLinks(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		ctx := context.Background()
		hold := func(key string, ttl int64) *services.Acquisition {
			a, err := f.s.adm.Acquire(ctx, f.pA, services.AcquireInput{Key: key, TTLSeconds: ttl, Operation: &f.op})
			require.NoError(t, err)
			return a
		}
		inv := hold("invoice:2026-11:1", 3600)
		hold("invoice:2026-12:1", 3600)
		hold("charge:1", 3600)
		soon := hold("soon", 120) // within the five-minute horizon

		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)

		page := b.get(f.keysURL("prefix=" + url.QueryEscape("invoice:2026-")))
		require.Equal(t, http.StatusOK, page.status, page.body)
		require.Equal(t, []string{"invoice:2026-12:1", "invoice:2026-11:1"}, dashKeys(page.rows()))
		require.Equal(t, "invoice:2026-", page.testid("filter-prefix").AttrOr("value", ""))
		refresh := page.testid("keys-results").AttrOr("hx-get", "")
		require.Contains(t, refresh, "prefix=invoice%3A2026-", "the refresh keeps the filter")
		require.Contains(t, refresh, "operation=")
		require.Equal(t, "#keys-results", page.testid("keys-results").AttrOr("hx-select", ""))

		link := page.testid("key-link").Last()
		require.Equal(t, "invoice:2026-11:1", strings.TrimSpace(link.Text()))
		// The link carries the filtered list back, so "← Keys" on the operation page keeps it.
		require.Equal(t, withBack("/operations/"+inv.OperationID, "/keys?operation="+url.QueryEscape(f.op)+"&prefix="+url.QueryEscape("invoice:2026-")),
			link.AttrOr("href", ""))
		opPage := b.get(link.AttrOr("href", ""))
		require.Equal(t, "← Keys", strings.TrimSpace(opPage.testid("op-back").Text()))
		require.Equal(t, "/keys?operation="+url.QueryEscape(f.op)+"&prefix="+url.QueryEscape("invoice:2026-"), opPage.testid("op-back").AttrOr("href", ""))

		exp := b.get(f.keysURL("expiring=1"))
		require.Equal(t, []string{"soon"}, dashKeys(exp.rows()))
		require.True(t, exp.testid("filter-expiring").Is("[checked]"))
		require.Equal(t, withBack("/operations/"+soon.OperationID, "/keys?expiring=1&operation="+url.QueryEscape(f.op)), exp.testid("key-link").AttrOr("href", ""))

		none := b.get(f.keysURL("prefix=nothing-starts-like-this"))
		require.Equal(t, 1, none.testid("keys-empty").Length())

		quick := page.testid("filter-needs-reconciliation").AttrOr("href", "")
		require.Equal(t, "/reconciliation", quick, "the queue of operations, superseded ones too")
	})
}

// TestAPIListKeysByPrefix: the JSON API takes the same prefix filter, byte-exact.
func TestAPIListKeysByPrefix(t *testing.T) {
	eachServer(t, func(t *testing.T, s *Server) {
		c := newTenantClient(t, s)
		for _, k := range []string{"ключ/1", "ключ/2", "Ключ/3", "key"} {
			require.Equal(t, 201, acquire(c, k, nil).status)
		}
		res := c.do("GET", "/v1/keys?prefix="+url.QueryEscape("ключ/"), nil)
		require.Equal(t, 200, res.status, res.raw)
		var got []string
		for _, it := range res.body["items"].([]any) {
			got = append(got, it.(map[string]any)["key"].(string))
		}
		require.Equal(t, []string{"ключ/2", "ключ/1"}, got, "case-sensitive, newest first")
	})
}

// TestDashboardKeysTenantFilter: a global account picks a tenant from the filter's select and
// sees only that tenant's keys; a restricted account's tenant parameter changes nothing.
func TestDashboardKeysTenantFilter(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		f.acquire(t, f.pA, "tf-a")
		f.acquire(t, f.pB, "tf-b")
		g := newDashBrowser(t, f.s)
		g.mustLogin(f.global)
		all := g.get(f.keysURL(""))
		require.ElementsMatch(t, []string{"tf-a", "tf-b"}, dashKeys(all.rows()))
		// Tenants are named by name, on this page as on Audit and Reconciliation (issue 28).
		idB := f.tenantB
		require.Equal(t, 1, all.testid("filter-tenant").Find(`option[value="`+idB+`"]`).Length(), "tenant B is offered")
		onlyB := g.get(f.keysURL("tenant=" + url.QueryEscape(idB)))
		require.Equal(t, []string{"tf-b"}, dashKeys(onlyB.rows()))
		require.Equal(t, idB, onlyB.testid("filter-tenant").Find("option[selected]").AttrOr("value", ""))
		none := g.get(f.keysURL("tenant=no-such-tenant"))
		require.Equal(t, http.StatusOK, none.status, "an unknown tenant matches nothing, as on Audit")
		require.Empty(t, none.rows())

		// The reconciliation queue takes the same name.
		f.uncertainOp(t, f.pA, "tf-queue-a")
		f.uncertainOp(t, f.pB, "tf-queue-b")
		queue := g.get("/reconciliation?tenant=" + url.QueryEscape(idB))
		require.Equal(t, http.StatusOK, queue.status, queue.body)
		require.Equal(t, 1, queue.testid("queue-link").Length())
		require.Equal(t, idB, queue.doc.Find(`select[name="tenant"] option[selected]`).AttrOr("value", ""))

		r := newDashBrowser(t, f.s)
		r.mustLogin(f.restricted)
		require.ElementsMatch(t, []string{"tf-a", "tf-queue-a"}, dashKeys(r.get(f.keysURL("tenant="+url.QueryEscape(idB))).rows()),
			"a restricted account stays in its tenant")
		require.Zero(t, r.get(f.keysURL("")).testid("filter-tenant").Length())
	})
}

// TestDashboardKeysTombstone: a success within its horizon shows how long its key is still
// protected; once retention purged it, the row shows what its tombstone kept, marked
// "evidence purged", without a link to an operation page that no longer exists.
func TestDashboardKeysTombstone(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		ctx := context.Background()
		retention, horizon := 10*time.Second, time.Hour
		name := "tomb-" + dashRandom()
		_, err := f.s.policies.Set(ctx, services.Installation(), services.PolicyInput{Tenant: f.tenantA, Operation: name,
			Retention: &retention, Horizon: &horizon})
		require.NoError(t, err)
		key := "tombkey-" + dashRandom()
		a, err := f.s.adm.Acquire(ctx, f.pA, services.AcquireInput{Key: key, TTLSeconds: 5, Operation: &name})
		require.NoError(t, err)
		_, err = f.s.adm.RecordOutcome(ctx, f.pA, a.OperationID, services.OutcomeInput{OwnerToken: a.OwnerToken,
			Status: services.StateSucceeded, Receipt: new("ch_9")})
		require.NoError(t, err)
		elapse(t, f.db, f.pA, 6*time.Second, key)

		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		row := func() *goquery.Selection {
			page := b.get("/keys?prefix=" + url.QueryEscape(key))
			require.Equal(t, http.StatusOK, page.status, page.body)
			rows := page.testid("key-row")
			require.Equal(t, 1, rows.Length())
			return rows
		}
		r := row()
		require.Regexp(t, `^(59m|1h 00m)`, strings.TrimSpace(r.Find(`[data-testid="key-ttl"]`).Text()), "protected by the horizon")
		require.Zero(t, r.Find(`[data-testid="key-tombstone"]`).Length())
		require.Equal(t, 1, r.Find(`[data-testid="key-link"]`).Length())

		elapse(t, f.db, f.pA, 5*time.Second, key)
		res, err := services.NewReaper(f.db, nil, 0).RunOnce(ctx)
		require.NoError(t, err)
		require.GreaterOrEqual(t, res.OperationsPurged, int64(1))
		r = row()
		require.Equal(t, "evidence purged", strings.TrimSpace(r.Find(`[data-testid="key-tombstone"]`).Text()))
		require.Zero(t, r.Find(`[data-testid="key-link"]`).Length(), "no page for a purged operation")
		state, _ := r.Find(`[data-testid="state-badge"]`).Attr("data-state")
		require.Equal(t, services.StateSucceeded, state)
		require.Equal(t, "1", strings.TrimSpace(r.Find(`[data-testid="key-fencing"]`).Text()))
	})
}
