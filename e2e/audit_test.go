//go:build e2e

package e2e

import (
	"encoding/csv"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"
)

// TestAuditCSV: duplicate and conflicting attempts show on the Audit page, a key admitted
// again after a confirmed success is flagged although nobody retried it, and links to the
// operation page's warning; the CSV export downloads and parses.
func TestAuditCSV(t *testing.T) {
	// Two duplicates and one conflict of one key.
	dup := admit(t, uniqueKey("charge:order"), 3600)
	for i := 0; i < 2; i++ {
		acquire(t, acquireReq{Key: dup.Key, TTLSeconds: 3600, Operation: "e2e-charge", Fingerprint: "sha256:e2e",
			AttemptID: "retry-" + randomHex(3)}, http.StatusOK)
	}
	acquire(t, acquireReq{Key: dup.Key, TTLSeconds: 3600, Operation: "e2e-charge", Fingerprint: "sha256:different"},
		http.StatusUnprocessableEntity)

	// A key that succeeded, expired and was admitted again: a possible duplicate effect.
	again := admit(t, uniqueKey("invoice:2026-11"), 1)
	recordOutcome(t, again, "succeeded", "inv_"+runID)
	eventually(t, 15*time.Second, "the hold of "+again.Key+" to expire", func() bool { return !getKey(t, again.Key).Held })
	// No duplicate or conflicting attempt of it: it is audited for the second admission alone.
	second := admit(t, again.Key, 3600)

	page := newPage(t)
	login(t, page, adminUser, adminPassword)
	gotoPage(t, page, "/audit")
	must(t, expect.Locator(page.GetByTestId("audit-table")).ToBeVisible(), "audit table")
	row := rowOf(page, "audit-row", dup.Key)
	must(t, expect.Locator(row).ToHaveCount(1), "row of "+dup.Key)
	must(t, expect.Locator(row.GetByTestId("audit-duplicates")).ToHaveText("2"), "two duplicates")
	must(t, expect.Locator(row.GetByTestId("audit-conflicts")).ToHaveText("1"), "one conflict")
	must(t, expect.Locator(row.GetByTestId("audit-flag")).ToHaveCount(0), "no flag without a second admission")
	must(t, expect.Locator(rowOf(page, "audit-row", again.Key).GetByTestId("audit-flag")).ToBeVisible(),
		"possible duplicate effect flagged")
	shot(t, page, "audit")

	download, err := page.ExpectDownload(func() error { return page.GetByTestId("audit-csv").Click() })
	must(t, err, "download the CSV")
	file := filepath.Join(t.TempDir(), "audit.csv")
	must(t, download.SaveAs(file), "save the CSV")
	f, err := os.Open(file)
	must(t, err, "open the CSV")
	defer f.Close()
	records, err := csv.NewReader(f).ReadAll()
	must(t, err, "parse the CSV")
	if len(records) < 2 {
		t.Fatalf("CSV has %d records, want a header and rows", len(records))
	}
	header := records[0]
	keyCol, resultCol := slices.Index(header, "key"), slices.Index(header, "result")
	if keyCol < 0 || resultCol < 0 || slices.Index(header, "attempted_at") < 0 {
		t.Fatalf("CSV header %q lacks key, result or attempted_at", header)
	}
	results := map[string]int{}
	for _, r := range records[1:] {
		if len(r) != len(header) {
			t.Fatalf("CSV row %q has %d fields, header %d", r, len(r), len(header))
		}
		if r[keyCol] == dup.Key {
			results[r[resultCol]]++
		}
	}
	if results["duplicate"] != 2 || results["conflict"] != 1 || results["admitted"] != 0 {
		t.Errorf("CSV rows of %s by result = %v, want 2 duplicate and 1 conflict", dup.Key, results)
	}
	t.Logf("CSV %s: %d rows, header %q", download.SuggestedFilename(), len(records)-1, header)

	// The flagged row links to the second operation, whose page names the first one.
	must(t, rowOf(page, "audit-row", again.Key).GetByTestId("audit-link").Click(), "open the flagged operation")
	must(t, expect.Page(page).ToHaveURL(regexp.MustCompile(`/operations/`+regexp.QuoteMeta(second.OperationID)+`$`)),
		"the row links to the second admission")
	warning := page.GetByTestId("op-possible-duplicate")
	must(t, expect.Locator(warning).ToBeVisible(), "possible duplicate effect warning")
	must(t, expect.Locator(warning).ToContainText(again.OperationID), "the warning names the earlier operation")
	shot(t, page, "operation-possible-duplicate")
}
