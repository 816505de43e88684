package web

import (
	"context"
	"encoding/csv"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/PuerkitoBio/goquery"
	"github.com/idemgate/idemgate/services"
	"github.com/stretchr/testify/require"
)

// auditTableRow is one row of the Audit table.
type auditTableRow struct {
	key, duplicates, conflicts string
	flagged                    bool
}

func (p dashPage) auditRows() []auditTableRow {
	var out []auditTableRow
	p.testid("audit-row").Each(func(_ int, s *goquery.Selection) {
		cell := func(id string) string { return strings.TrimSpace(s.Find(`[data-testid="` + id + `"]`).Text()) }
		out = append(out, auditTableRow{key: cell("audit-key"), duplicates: cell("audit-duplicates"),
			conflicts: cell("audit-conflicts"), flagged: s.Find(`[data-testid="audit-flag"]`).Length() == 1})
	})
	return out
}

const auditFormulaKey = `=HYPERLINK("x")`

// auditWorld makes, in tenant A: "dup" with two duplicates and a conflict, "again" succeeded
// and then admitted again with one duplicate, and the formula key with one duplicate; in
// tenant B: "dup" with one duplicate. Tenant A's attempts are then 5 duplicate/conflict rows.
func (f *dashFixture) auditWorld(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	f.acquire(t, f.pA, "dup")
	f.acquire(t, f.pA, "dup")
	f.acquire(t, f.pA, "dup")
	_, err := f.s.adm.Acquire(ctx, f.pA, services.AcquireInput{Key: "dup", TTLSeconds: 300, Operation: &f.op, Fingerprint: &f.op})
	require.ErrorIs(t, err, services.ErrFingerprintMismatch)

	first, err := f.s.adm.Acquire(ctx, f.pA, services.AcquireInput{Key: "again", TTLSeconds: 1, Operation: &f.op})
	require.NoError(t, err)
	_, err = f.s.adm.RecordOutcome(ctx, f.pA, first.OperationID, services.OutcomeInput{OwnerToken: first.OwnerToken, Status: "succeeded"})
	require.NoError(t, err)
	elapse(t, f.db, f.pA, time.Second, "again")
	require.True(t, f.acquire(t, f.pA, "again").Admitted)
	require.False(t, f.acquire(t, f.pA, "again").Admitted)

	f.acquire(t, f.pA, auditFormulaKey)
	f.acquire(t, f.pA, auditFormulaKey)

	f.acquire(t, f.pB, "dup")
	f.acquire(t, f.pB, "dup")
}

func TestDashboardAuditGroupsAndFlags(t *testing.T) {
	t.Parallel()
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		f.auditWorld(t)
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		p := b.get("/audit")
		require.Equal(t, http.StatusOK, p.status, p.body)
		requirePageHeaders(t, p)
		require.Equal(t, 1, p.testid("audit-filter").Length())
		require.Equal(t, 1, p.testid("audit-table").Length())
		require.Zero(t, p.testid("audit-tenant").Length(), "a restricted account has no tenant filter")

		rows := p.auditRows()
		require.Equal(t, []auditTableRow{
			{key: auditFormulaKey, duplicates: "1", conflicts: "0"},
			{key: "again", duplicates: "1", conflicts: "0", flagged: true},
			{key: "dup", duplicates: "2", conflicts: "1"},
		}, rows)
		require.Contains(t, p.testid("audit-flag").Text(), "Admitted again after success")
		href, _ := p.testid("audit-csv").Attr("href")
		require.Equal(t, "/audit.csv", href)

		// A tenant name in the query is ignored for a restricted account.
		require.Len(t, b.get("/audit?tenant="+f.tenantB).auditRows(), 3)

		// A range that ends before the attempts shows none, and the CSV link keeps the query.
		from := time.Now().UTC().Add(-48 * time.Hour).Format("2006-01-02T15:04")
		to := time.Now().UTC().Add(-24 * time.Hour).Format("2006-01-02T15:04")
		old := b.get("/audit?from=" + from + "&to=" + to)
		require.Equal(t, http.StatusOK, old.status)
		require.Empty(t, old.auditRows())
		require.Equal(t, 1, old.testid("audit-empty").Length())
		v, _ := old.testid("audit-from").Attr("value")
		require.Equal(t, from, v)
		href, _ = old.testid("audit-csv").Attr("href")
		require.Contains(t, href, "/audit.csv?")
		require.Contains(t, href, "from="+strings.ReplaceAll(from, ":", "%3A"))

		// A global auditor may filter by tenant.
		g := newDashBrowser(t, f.s)
		g.mustLogin(f.global)
		gp := g.get("/audit?tenant=" + f.tenantB)
		require.Equal(t, http.StatusOK, gp.status, gp.body)
		require.Equal(t, []auditTableRow{{key: "dup", duplicates: "1", conflicts: "0"}}, gp.auditRows())
		require.Equal(t, f.tenantB, strings.TrimSpace(gp.testid("audit-tenant-name").Text()))
		require.Equal(t, 1, gp.testid("audit-tenant").Length())
		require.Equal(t, 1, gp.testid("audit-tenant").Find(`option[value="`+f.tenantB+`"]`).Length(), "tenants are chosen from a list")
	})
}

func TestDashboardAuditBadRange(t *testing.T) {
	t.Parallel()
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.global)
		for _, q := range []string{
			"from=2026-01-02T00:00&to=2026-01-01T00:00", // to before from
			"from=2026-01-01T00:00&to=2026-03-01T00:00", // over 31 days
			"from=yesterday",
			// Issue 28 item 6: the zero time is a time, not "no from" (the last 24 h).
			"from=0001-01-01T00:00:00Z",
			"to=0001-01-01T00:00:00Z",
			"from=1969-12-31T23:59",
		} {
			for _, path := range []string{"/audit?", "/audit.csv?"} {
				p := b.get(path + q)
				require.Equal(t, http.StatusBadRequest, p.status, path+q)
				require.Equal(t, 1, p.testid("error-page").Length(), path+q)
				require.Equal(t, "text/html; charset=utf-8", p.header.Get("Content-Type"))
			}
		}
	})
}

func TestDashboardAuditCSV(t *testing.T) {
	t.Parallel()
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		f.auditWorld(t)
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		p := b.get("/audit.csv")
		require.Equal(t, http.StatusOK, p.status, p.body)
		require.Equal(t, "text/csv; charset=utf-8", p.header.Get("Content-Type"))
		require.Regexp(t, regexp.MustCompile(`^attachment; filename="idemgate-audit-\d{8}T\d{6}Z-\d{8}T\d{6}Z\.csv"$`),
			p.header.Get("Content-Disposition"))

		recs, err := csv.NewReader(strings.NewReader(p.body)).ReadAll()
		require.NoError(t, err)
		require.Equal(t, []string{"tenant", "key", "attempted_at", "result", "operation_id", "attempt_id", "caller",
			"fingerprint", "correlation_id", "possible_duplicate_effect"}, recs[0])
		recs = recs[1:]
		require.Len(t, recs, 6, "one row per duplicate or conflicting attempt of tenant A, and the admission after success")
		flagged := map[string][]string{}
		results := map[string][]string{}
		for _, r := range recs {
			require.Equal(t, f.tenantA, r[0])
			_, err := time.Parse(time.RFC3339, r[2])
			require.NoError(t, err, r[2])
			require.NotEmpty(t, r[4], "operation id")
			require.Equal(t, f.pA.Prefix, r[6])
			results[r[1]] = append(results[r[1]], r[3])
			flagged[r[1]] = append(flagged[r[1]], r[9])
		}
		require.Equal(t, []string{"duplicate", "duplicate", "conflict"}, results["dup"])
		require.Equal(t, []string{"false", "false", "false"}, flagged["dup"])
		// The admission after success, then the duplicate answered about that admission.
		require.Equal(t, []string{"admitted", "duplicate"}, results["again"])
		require.Equal(t, []string{"true", "true"}, flagged["again"])
		// The formula key is neutralised: a spreadsheet shows it as text.
		require.Equal(t, []string{"duplicate"}, results["'"+auditFormulaKey])
		require.NotContains(t, results, auditFormulaKey)

		// Signed out, the export redirects to sign-in.
		out := newDashBrowser(t, f.s).get("/audit.csv")
		require.Equal(t, http.StatusSeeOther, out.status)
	})
}

func TestCSVCell(t *testing.T) {
	for in, want := range map[string]string{
		"order-1": "order-1", "=1+1": "'=1+1", "+1": "'+1", "-1": "'-1", "@SUM(A1)": "'@SUM(A1)",
		"\tx": "'\tx", "\rx": "'\rx", "": "", "a=b": "a=b",
	} {
		require.Equal(t, want, csvCell(in), in)
	}
}

// TestDashboardAuditPossibleDuplicateEffect: a key admitted again while its earlier operation
// had succeeded ("resold") or was uncertain ("lost": its hold expired in progress and the new
// admission took it over) is audited although nobody sent a duplicate or conflicting attempt:
// a row on the page linking to the new operation, its admission in the CSV with the operation
// id, and a warning on the operation's page naming the earlier one. A key whose earlier
// operation failed and was released ("clean") is not.
func TestDashboardAuditPossibleDuplicateEffect(t *testing.T) {
	t.Parallel()
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		ctx := context.Background()
		resold1 := f.opAcquire(t, f.pA, "resold", 1, "")
		_, err := f.s.adm.RecordOutcome(ctx, f.pA, resold1.OperationID, services.OutcomeInput{OwnerToken: resold1.OwnerToken,
			Status: "succeeded"})
		require.NoError(t, err)
		lost1 := f.opAcquire(t, f.pA, "lost", 1, "")
		clean1 := f.opAcquire(t, f.pA, "clean", 1, "")
		_, err = f.s.adm.RecordOutcome(ctx, f.pA, clean1.OperationID, services.OutcomeInput{OwnerToken: clean1.OwnerToken,
			Status: "failed", Release: true})
		require.NoError(t, err)
		elapse(t, f.db, f.pA, time.Second, "resold", "lost", "clean")
		resold2 := f.opAcquire(t, f.pA, "resold", 300, "")
		lost2 := f.opAcquire(t, f.pA, "lost", 300, "")
		clean2 := f.opAcquire(t, f.pA, "clean", 300, "")

		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		p := b.get("/audit")
		require.Equal(t, http.StatusOK, p.status, p.body)
		require.Equal(t, []auditTableRow{
			{key: "lost", duplicates: "0", conflicts: "0", flagged: true},
			{key: "resold", duplicates: "0", conflicts: "0", flagged: true},
		}, p.auditRows())
		links := map[string]string{}
		p.testid("audit-row").Each(func(_ int, s *goquery.Selection) {
			links[strings.TrimSpace(s.Find(`[data-testid="audit-key"]`).Text())] = s.Find(`[data-testid="audit-link"]`).AttrOr("href", "")
		})
		require.Equal(t, map[string]string{"lost": "/operations/" + lost2.OperationID, "resold": "/operations/" + resold2.OperationID}, links)

		c := b.get("/audit.csv")
		require.Equal(t, http.StatusOK, c.status, c.body)
		recs, err := csv.NewReader(strings.NewReader(c.body)).ReadAll()
		require.NoError(t, err)
		col := map[string]int{}
		for i, h := range recs[0] {
			col[h] = i
		}
		require.Contains(t, col, "possible_duplicate_effect")
		got := map[string][]string{}
		for _, r := range recs[1:] {
			got[r[col["key"]]] = []string{r[col["result"]], r[col["operation_id"]], r[col["possible_duplicate_effect"]]}
		}
		require.Equal(t, map[string][]string{
			"lost":   {"admitted", lost2.OperationID, "true"},
			"resold": {"admitted", resold2.OperationID, "true"},
		}, got)

		// lost2's own outcome is unknown too: its page leads with the outcome form.
		_, err = f.s.adm.RecordOutcome(context.Background(), f.pA, lost2.OperationID,
			services.OutcomeInput{OwnerToken: lost2.OwnerToken, Status: services.StateUncertain})
		require.NoError(t, err)
		for earlier, later := range map[string]string{resold1.OperationID: resold2.OperationID, lost1.OperationID: lost2.OperationID} {
			op := b.get("/operations/" + later)
			require.Equal(t, http.StatusOK, op.status)
			warn := op.testid("op-possible-duplicate")
			require.Equal(t, 1, warn.Length(), op.body)
			require.Contains(t, warn.Text(), earlier)
			require.Equal(t, "/operations/"+earlier, warn.Find("a").AttrOr("href", ""))
			// Nobody reconciles without reading it: it comes before the outcome form (issue 28).
			form := strings.Index(op.body, `data-testid="outcome-form"`)
			require.Positive(t, form, "the outcome form")
			require.Less(t, strings.Index(op.body, `data-testid="op-possible-duplicate"`), form)
			require.Zero(t, b.get("/operations/"+earlier).testid("op-possible-duplicate").Length())
		}
		require.Zero(t, b.get("/operations/"+clean2.OperationID).testid("op-possible-duplicate").Length())
	})
}

// TestDashboardAuditFlaggedAndSort: "possible duplicate effects only" keeps the flagged keys,
// "most attempts first" orders by duplicate plus conflicting attempts, and the CSV link keeps
// the time and tenant filter only (the export lists every attempt).
func TestDashboardAuditFlaggedAndSort(t *testing.T) {
	t.Parallel()
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		ctx := context.Background()
		resold1 := f.opAcquire(t, f.pA, "resold", 1, "")
		_, err := f.s.adm.RecordOutcome(ctx, f.pA, resold1.OperationID, services.OutcomeInput{OwnerToken: resold1.OwnerToken,
			Status: "succeeded"})
		require.NoError(t, err)
		elapse(t, f.db, f.pA, time.Second, "resold")
		f.opAcquire(t, f.pA, "resold", 300, "")
		f.acquire(t, f.pA, "few")
		f.acquire(t, f.pA, "few")
		f.acquire(t, f.pA, "many")
		for range 3 {
			f.acquire(t, f.pA, "many")
		}
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		keys := func(p dashPage) []string {
			var out []string
			for _, r := range p.auditRows() {
				out = append(out, r.key)
			}
			return out
		}
		all := b.get("/audit")
		require.ElementsMatch(t, []string{"resold", "few", "many"}, keys(all))
		flagged := b.get("/audit?flagged=1")
		require.Equal(t, []string{"resold"}, keys(flagged))
		require.True(t, flagged.testid("audit-flagged").Is("[checked]"))
		text := func(p dashPage) string { return strings.Join(strings.Fields(p.testid("audit-total").Text()), " ") }
		require.Equal(t, "3 keys in this range.", text(all))
		require.Equal(t, "1 key with a possible duplicate effect in this range.", text(flagged))
		byAttempts := b.get("/audit?sort=attempts")
		require.Equal(t, []string{"many", "few", "resold"}, keys(byAttempts))
		require.Equal(t, "/audit.csv", byAttempts.testid("audit-csv").AttrOr("href", ""))
		require.Equal(t, "attempts", byAttempts.testid("audit-sort").Find("option[selected]").AttrOr("value", ""))
	})
}

// TestDashboardAuditPager: the Audit page pages by time, newest first: "Older" is the range of
// the same length before, "Newer" the one after, "Latest" the default range; the filter and
// sort are kept, and Newer from an older range comes back to the same rows.
func TestDashboardAuditPager(t *testing.T) {
	t.Parallel()
	dashEachDB(t, func(t *testing.T, f *dashFixture) {
		f.acquire(t, f.pA, "pager")
		f.acquire(t, f.pA, "pager")
		b := newDashBrowser(t, f.s)
		b.mustLogin(f.restricted)
		keys := func(p dashPage) []string {
			var out []string
			for _, r := range p.auditRows() {
				out = append(out, r.key)
			}
			return out
		}
		first := b.get("/audit?sort=attempts")
		require.Equal(t, http.StatusOK, first.status, first.body)
		require.Equal(t, []string{"pager"}, keys(first))
		require.Zero(t, first.testid("audit-newer").Length(), "the default range reaches now")
		require.Zero(t, first.testid("audit-latest").Length())
		olderURL := first.testid("audit-older").AttrOr("href", "")
		require.Contains(t, olderURL, "sort=attempts")

		older := b.get(olderURL)
		require.Equal(t, http.StatusOK, older.status, older.body)
		require.Empty(t, keys(older), "the day before holds none of this test's attempts")
		require.Equal(t, "/audit?sort=attempts", older.testid("audit-latest").AttrOr("href", ""))
		// The range is 24 hours like the default one, just before it.
		from, err := time.Parse("2006-01-02T15:04", older.testid("audit-from").AttrOr("value", ""))
		require.NoError(t, err)
		to, err := time.Parse("2006-01-02T15:04", older.testid("audit-to").AttrOr("value", ""))
		require.NoError(t, err)
		require.Equal(t, 24*time.Hour, to.Sub(from))
		require.WithinDuration(t, time.Now().Add(-24*time.Hour), to, 2*time.Minute)

		newer := b.get(older.testid("audit-newer").AttrOr("href", ""))
		require.Equal(t, http.StatusOK, newer.status, newer.body)
		require.Equal(t, []string{"pager"}, keys(newer))
	})
}

// FuzzParseAuditTime: a from or to parameter is "" (no bound: the zero time), or a time at or
// after 1970 in UTC that prints back as itself in RFC 3339, or refused; never the zero time
// for a non-empty value, which the audit would read as no bound (issue 28).
func FuzzParseAuditTime(f *testing.F) {
	for _, s := range []string{"", "2026-01-31T09:30", "2026-01-31T09:30:15", "2026-01-31T09:30:00+02:00",
		"0001-01-01T00:00:00Z", "1969-12-31T23:59", "1970-01-01T00:00", "yesterday", "9999-12-31T23:59"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		tm, ok := parseAuditTime(raw)
		if !ok {
			return
		}
		if raw == "" {
			require.True(t, tm.IsZero())
			return
		}
		require.False(t, tm.IsZero(), raw)
		require.GreaterOrEqual(t, tm.Unix(), int64(0), raw)
		require.Equal(t, time.UTC, tm.Location(), raw)
		back, err := time.Parse(time.RFC3339Nano, tm.Format(time.RFC3339Nano))
		require.NoError(t, err, raw)
		require.True(t, back.Equal(tm), raw)
	})
}
