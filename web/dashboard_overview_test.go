package web

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// overviewExpireAndReacquire acquires key in p's tenant with a 1 s TTL, waits for the hold to
// expire and acquires it again, leaving the first operation uncertain.
func (f *dashFixture) overviewExpireAndReacquire(t *testing.T, p services.Principal, keys ...string) {
	t.Helper()
	ctx := context.Background()
	for _, k := range keys {
		_, err := f.s.adm.Acquire(ctx, p, services.AcquireInput{Key: k, TTLSeconds: 1, Operation: &f.op})
		require.NoError(t, err)
	}
	elapse(t, f.db, p, time.Second, keys...)
	for _, k := range keys {
		a := f.acquire(t, p, k)
		require.True(t, a.Admitted)
	}
}

// overviewCount reads a number from the page's element with data-testid id.
func overviewCount(t *testing.T, p dashPage, id string) int64 {
	t.Helper()
	sel := p.testid(id)
	require.Equal(t, 1, sel.Length(), "one %s in:\n%s", id, p.body)
	v, ok := sel.Attr("data-count")
	if !ok {
		v = strings.TrimSpace(sel.Find(`[data-testid="overview-needs-count"]`).Text())
	}
	n, err := strconv.ParseInt(v, 10, 64)
	require.NoError(t, err, "count of %s: %q", id, v)
	return n
}

func TestDashboardOverviewTenantScope(t *testing.T) {
	t.Parallel()
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		// Tenant A: one uncertain operation (its key re-acquired, so in progress again), one
		// more in progress with a duplicate. Tenant B: two uncertain ones.
		f.overviewExpireAndReacquire(t, f.pA, "a-late")
		f.acquire(t, f.pA, "a-busy")
		dup := f.acquire(t, f.pA, "a-busy")
		require.False(t, dup.Admitted)
		f.overviewExpireAndReacquire(t, f.pB, "b-late-1", "b-late-2")

		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		p := b.get("/")
		require.Equal(t, http.StatusOK, p.status, p.body)
		requirePageHeaders(t, p)
		require.Contains(t, p.testid("overview-scope").Text(), "Tenant "+f.tenantA)
		aria, _ := p.testid("nav-overview").Attr("aria-current")
		require.Equal(t, "page", aria)

		require.EqualValues(t, 1, overviewCount(t, p, "overview-needs-reconciliation"))
		href, _ := p.testid("overview-needs-reconciliation").Attr("href")
		require.Equal(t, "/reconciliation", href)
		require.EqualValues(t, 2, overviewCount(t, p, "overview-count-in_progress"))
		require.EqualValues(t, 1, overviewCount(t, p, "overview-count-uncertain"))
		for _, s := range []string{"succeeded", "failed", "released"} {
			require.EqualValues(t, 0, overviewCount(t, p, "overview-count-"+s), s)
		}
		// Each card names its state in text, not only in colour.
		require.Contains(t, p.testid("overview-count-uncertain").Text(), "Uncertain")

		// The chart: 24 hours, each with a tooltip, holding this tenant's 3 admissions and 1
		// duplicate (possibly split across an hour boundary), and a text legend.
		chart := p.testid("overview-chart")
		require.Equal(t, 1, chart.Length())
		hours := chart.Find(`[data-testid="chart-hour"]`)
		require.Equal(t, 24, hours.Length())
		sum := func(id string) int64 {
			var n int64
			hours.Find(`[data-testid="` + id + `"]`).Each(func(_ int, s *goquery.Selection) {
				v, _ := s.Attr("data-value")
				x, err := strconv.ParseInt(v, 10, 64)
				require.NoError(t, err)
				n += x
			})
			return n
		}
		require.EqualValues(t, 3, sum("chart-bar-admitted"))
		require.EqualValues(t, 1, sum("chart-bar-duplicate"))
		require.EqualValues(t, 0, sum("chart-bar-conflict"))
		hours.Each(func(_ int, s *goquery.Selection) {
			require.Contains(t, s.Find("title").Text(), "UTC: ")
		})
		require.Contains(t, p.testid("overview-legend").Text(), "Duplicate")
		require.Zero(t, p.doc.Find("script:not([src])").Length(), "no inline script")

		// A global account sees every tenant, so at least both tenants' uncertain operations.
		g := newDashBrowser(t, f.s)
		g.mustLogin(f.global)
		gp := g.get("/")
		require.Equal(t, http.StatusOK, gp.status)
		require.GreaterOrEqual(t, overviewCount(t, gp, "overview-needs-reconciliation"), int64(3))
		require.Contains(t, gp.testid("overview-scope").Text(), "All tenants")
	})
}

func TestDashboardOverviewRequiresSignIn(t *testing.T) {
	t.Parallel()
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		p := newDashBrowser(t, f.s).get("/")
		require.Equal(t, http.StatusSeeOther, p.status)
		require.Equal(t, "/login", p.header.Get("Location"))
	})
}

// TestDashboardOverviewRange: the Overview's 24 hours / 7 days links switch the chart (24
// hourly or 28 six-hour bars), mark the current range, and the 30 s refresh reloads the same
// range; an unknown range is a 400 page.
func TestDashboardOverviewRange(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		f.acquire(t, f.pA, "range-key")
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		day := b.get("/")
		require.Equal(t, http.StatusOK, day.status, day.body)
		require.Equal(t, 24, day.testid("chart-hour").Length())
		require.Equal(t, "/", day.testid("overview-body").AttrOr("hx-get", ""))
		links := day.testid("overview-range-link")
		require.Equal(t, 2, links.Length())
		require.Equal(t, "24 hours", strings.TrimSpace(links.Filter(`[aria-current="page"]`).Text()))
		week := links.FilterFunction(func(_ int, s *goquery.Selection) bool { return strings.TrimSpace(s.Text()) == "7 days" })
		require.Equal(t, "/?range=7d", week.AttrOr("href", ""))

		p := b.get(week.AttrOr("href", ""))
		require.Equal(t, http.StatusOK, p.status, p.body)
		require.Equal(t, 28, p.testid("chart-hour").Length())
		require.Equal(t, "/?range=7d", p.testid("overview-body").AttrOr("hx-get", ""), "the refresh keeps the range")
		require.Equal(t, "7 days", strings.TrimSpace(p.testid("overview-range-link").Filter(`[aria-current="page"]`).Text()))
		require.Contains(t, p.doc.Find("#chart-title").Text(), "last 7 days")
		var admitted int
		p.testid("chart-bar-admitted").Each(func(_ int, s *goquery.Selection) {
			n, _ := strconv.Atoi(s.AttrOr("data-value", ""))
			admitted += n
		})
		require.GreaterOrEqual(t, admitted, 1, "this test's admission is in the last bucket")

		bad := b.get("/?range=30d")
		require.Equal(t, http.StatusBadRequest, bad.status)
		require.Contains(t, bad.testid("error-message").Text(), "7 days")
	})
}
