package web

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/PuerkitoBio/goquery"
	"github.com/idemgate/idemgate/services"

	"github.com/stretchr/testify/require"
)

// pageWalk pages a dashboard list forwards from first along the next link (nextID), then
// backwards from the last page along the previous link (prevID), and checks that going back
// shows the same pages as going forwards, that only pages after the first carry the previous
// and the first-page (firstID) links, and that the first page's link leads to the first page.
// ids reads a page's rows.
func pageWalk(t *testing.T, b *dashBrowser, first, nextID, prevID, firstID string, ids func(dashPage) []string) [][]string {
	t.Helper()
	var pages [][]string
	var prev string
	for url, i := first, 0; url != ""; i++ {
		require.Less(t, i, 10, "forward pagination does not end")
		page := b.get(url)
		require.Equal(t, http.StatusOK, page.status, page.body)
		pages = append(pages, ids(page))
		if i == 0 {
			require.Zero(t, page.testid(prevID).Length(), "the first page has no previous page")
			require.Zero(t, page.testid(firstID).Length())
		} else {
			require.Equal(t, 1, page.testid(prevID).Length(), "page %d links back", i)
			require.Equal(t, pages[0], ids(b.get(page.testid(firstID).AttrOr("href", ""))), "the first-page link")
		}
		prev = page.testid(prevID).AttrOr("href", "")
		url = page.testid(nextID).AttrOr("href", "")
	}
	require.Greater(t, len(pages), 2, "the test needs at least three pages")
	for i := len(pages) - 2; i >= 0; i-- {
		page := b.get(prev)
		require.Equal(t, http.StatusOK, page.status, page.body)
		require.Equal(t, pages[i], ids(page), "backwards, page %d", i)
		require.Equal(t, pages[i+1], ids(b.get(page.testid(nextID).AttrOr("href", ""))), "forwards again from page %d", i)
		prev = page.testid(prevID).AttrOr("href", "")
		if i == 0 {
			require.Empty(t, prev, "back at the first page: no previous link")
		}
	}
	return pages
}

// TestDashboardKeysNewer: the Keys page's "Newer" link walks back page by page to the newest
// keys, keeping the filter, the same pages as "Older" showed.
func TestDashboardKeysNewer(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		var want []string
		for i := 0; i < 8; i++ {
			k := fmt.Sprintf("newer-%d", i)
			f.acquire(t, f.pA, k)
			want = append([]string{k}, want...)
		}
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		pages := pageWalk(t, b, f.keysURL("limit=3"), "page-older", "page-newer", "page-newest",
			func(p dashPage) []string { return dashKeys(p.rows()) })
		var all []string
		for _, p := range pages {
			all = append(all, p...)
		}
		require.Equal(t, want, all)

		// The link keeps the filter and the page size; a forged cursor is a clean 400.
		second := b.get(b.get(f.keysURL("limit=3")).testid("page-older").AttrOr("href", ""))
		newer := second.testid("page-newer").AttrOr("href", "")
		require.Contains(t, newer, "operation="+f.op)
		require.Contains(t, newer, "limit=3")
		require.NotContains(t, newer, "cursor=")
		res := b.get(f.keysURL("newer=not-a-cursor"))
		require.Equal(t, http.StatusBadRequest, res.status)
	})
}

// TestDashboardQueuePrevious: the queue's "Previous" link walks back to its oldest page, the
// same pages as "Next" showed (pages of 100).
func TestDashboardQueuePrevious(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		var want []string
		for i := 0; i < 2*queuePageSize+5; i++ {
			want = append(want, f.uncertainOp(t, f.pA, fmt.Sprintf("qprev-%03d", i)).OperationID)
		}
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		ids := func(p dashPage) []string {
			var out []string
			p.testid("queue-link").Each(func(_ int, s *goquery.Selection) {
				// The operation, not its link: the link carries the page it came from.
				href, _, _ := strings.Cut(s.AttrOr("href", ""), "?")
				out = append(out, href)
			})
			return out
		}
		pages := pageWalk(t, b, "/reconciliation", "page-next", "page-prev", "page-first", ids)
		require.Len(t, pages, 3)
		n := 0
		for _, p := range pages {
			n += len(p)
		}
		require.Equal(t, len(want), n)
		require.Contains(t, pages[0][0], want[0], "oldest first")

		res := b.get("/reconciliation?back=not-a-cursor")
		require.Equal(t, http.StatusBadRequest, res.status)
		require.Contains(t, res.testid("error-message").Text(), "first page")
	})
}

// TestDashboardKeysTotal: the Keys page says how many keys match, on all pages, for a global
// account across tenants and for a restricted one within its tenant.
func TestDashboardKeysTotal(t *testing.T) {
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		for i := 0; i < 4; i++ {
			f.acquire(t, f.pA, fmt.Sprintf("total-a-%d", i))
		}
		f.acquire(t, f.pB, "total-b-0")
		total := func(b *dashBrowser, url string) string {
			t.Helper()
			p := b.get(url)
			require.Equal(t, http.StatusOK, p.status, p.body)
			return strings.Join(strings.Fields(p.testid("keys-total").Text()), " ")
		}
		global := newDashBrowser(t, f.s)
		global.mustLogin(f.global)
		require.Equal(t, "5 keys match the filter.", total(global, f.keysURL("")))
		require.Equal(t, "5 keys match the filter.", total(global, f.keysURL("limit=2")), "all pages, not this one")
		require.Equal(t, "1 key matches the filter.", total(global, f.keysURL("prefix=total-b")))
		restricted := newDashBrowser(t, f.s)
		restricted.mustLogin(f.restricted)
		require.Equal(t, "4 keys match the filter.", total(restricted, f.keysURL("")))
	})
}

func TestKeyTotalWording(t *testing.T) {
	for want, in := range map[string]struct {
		n        services.KeyCount
		filtered bool
	}{
		"0 keys.":                      {services.KeyCount{}, false},
		"1 key.":                       {services.KeyCount{N: 1}, false},
		"1 key matches the filter.":    {services.KeyCount{N: 1}, true},
		"2,345 keys match the filter.": {services.KeyCount{N: 2345}, true},
		"1,000+ keys.":                 {services.KeyCount{N: services.KeyCountCap, Capped: true}, false},
	} {
		require.Equal(t, want, keyTotal(in.n, in.filtered))
	}
}

func TestAuditTotalWording(t *testing.T) {
	require.Equal(t, "0 keys in this range.", auditTotal(0, false, false))
	require.Equal(t, "1 key in this range.", auditTotal(1, false, false))
	require.Equal(t, "500+ keys in this range.", auditTotal(services.MaxAuditGroups, true, false))
	require.Equal(t, "1,200 keys with a possible duplicate effect in this range.", auditTotal(1200, false, true))
}
