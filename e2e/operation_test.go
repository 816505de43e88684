//go:build e2e

package e2e

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/playwright-community/playwright-go"
)

// TestReconcileUncertain: an operation whose TTL ran out becomes uncertain, is listed as
// needing reconciliation, the operator records the confirmed outcome, and it leaves the list.
func TestReconcileUncertain(t *testing.T) {
	a := admit(t, uniqueKey("charge:order"), 1)
	eventually(t, 20*time.Second, a.OperationID+" to become uncertain", func() bool {
		return getOperation(t, a.OperationID).State == "uncertain"
	})

	page := newPage(t)
	failOnDialog(t, page)
	login(t, page, adminUser, adminPassword)
	gotoPage(t, page, "/keys?state=uncertain")
	must(t, expect.Locator(rowOf(page, "key-row", a.Key)).ToHaveCount(1), "listed as needing reconciliation")
	shot(t, page, "needs-reconciliation")

	gotoPage(t, page, "/operations/"+a.OperationID)
	must(t, expect.Locator(page.GetByTestId("op-key")).ToHaveText(a.Key), "operation page of "+a.Key)
	must(t, expect.Locator(page.GetByTestId("op-state")).ToContainText(ci("uncertain")), "state uncertain")
	form := page.GetByTestId("outcome-form")
	must(t, expect.Locator(form).ToBeVisible(), "outcome form")
	must(t, page.GetByTestId("outcome-status-succeeded").Check(), "choose succeeded")
	must(t, form.Locator("input[name=receipt]").Fill("rcpt-123"), "fill receipt")
	const note = "Checked the payment provider: charge rcpt-123 went through."
	must(t, form.Locator("textarea[name=note]").Fill(note), "fill note")
	shot(t, page, "outcome-form")
	must(t, page.GetByTestId("outcome-submit").Click(), "record the outcome")

	must(t, expect.Locator(page.GetByTestId("op-state")).ToContainText(ci("succeeded")), "state succeeded")
	must(t, expect.Locator(page.GetByTestId("outcome-receipt")).ToContainText("rcpt-123"), "receipt shown")
	must(t, expect.Locator(page.GetByTestId("action-error")).ToHaveCount(0), "no error")
	must(t, expect.Locator(page.GetByTestId("outcome-form")).ToHaveCount(0), "no outcome form once succeeded")
	must(t, expect.Locator(rowOf(page, "event-row", "admin")).Not().ToHaveCount(0), "the event names the operator")
	shot(t, page, "reconciled")

	op := getOperation(t, a.OperationID)
	if op.State != "succeeded" || op.Outcome == nil || op.Outcome.Receipt == nil || *op.Outcome.Receipt != "rcpt-123" {
		t.Errorf("API shows %+v, want succeeded with receipt rcpt-123", op)
	} else if op.Outcome.Note == nil || *op.Outcome.Note != note || !strings.Contains(op.Outcome.RecordedBy, adminUser) {
		t.Errorf("outcome note %v recorded by %q, want %q by %s", op.Outcome.Note, op.Outcome.RecordedBy, note, adminUser)
	}

	gotoPage(t, page, "/keys?state=uncertain")
	must(t, expect.Locator(page.GetByTestId("keys-table").Or(page.GetByTestId("keys-empty"))).ToBeVisible(), "keys page")
	must(t, expect.Locator(rowOf(page, "key-row", a.Key)).ToHaveCount(0), "no longer needs reconciliation")
}

// TestStaleRelease: the operator opens the release form of operation A, the hold expires
// and attempt B acquires the key through the API, then the operator submits: the page
// refuses, names B, and B's hold is intact.
func TestStaleRelease(t *testing.T) {
	page := newPage(t)
	failOnDialog(t, page)
	login(t, page, adminUser, adminPassword)

	// A short hold, so the page must be open before it runs out: sign in first.
	key := uniqueKey("charge:order")
	a := admit(t, key, 3)
	gotoPage(t, page, "/operations/"+a.OperationID)
	must(t, expect.Locator(page.GetByTestId("op-key")).ToHaveText(key), "operation page of A")
	must(t, expect.Locator(page.GetByTestId("release-form")).ToBeVisible(), "release form of A")
	must(t, page.GetByTestId("release-reason").Fill("Customer cancelled before we called the provider."), "fill reason")
	must(t, page.GetByTestId("release-confirm").Check(), "confirm")
	shot(t, page, "release-form")

	eventually(t, 15*time.Second, "A's hold of "+key+" to expire", func() bool { return !getKey(t, key).Held })
	b := admit(t, key, 3600)
	if b.OperationID == a.OperationID {
		t.Fatalf("re-acquire admitted the same operation %s", a.OperationID)
	}

	must(t, page.GetByTestId("release-submit").Click(), "submit the stale release")
	must(t, expect.Locator(page.GetByTestId("action-error")).ToContainText(b.OperationID), "the refusal names B")
	must(t, expect.Locator(page.GetByTestId("flash")).ToHaveCount(0), "no success message")
	shot(t, page, "refused")
	docShot(t, page, "operation-stale-release", "desktop")

	k := getKey(t, key)
	if !k.Held || k.Operation == nil || k.Operation.ID != b.OperationID || k.Operation.State != "in_progress" {
		t.Errorf("GET /v1/keys/%s = %+v, want held by B %s (in_progress)", key, k, b.OperationID)
	}
	if op := getOperation(t, b.OperationID); !op.Held || op.FencingToken != b.FencingToken {
		t.Errorf("B = %+v, want held with fencing token %d", op, b.FencingToken)
	}
}

// TestAuditorReadOnly: an auditor sees an operation without action forms, and a POST
// crafted by hand from the auditor's session (with a valid CSRF token) is refused.
func TestAuditorReadOnly(t *testing.T) {
	username, password := "auditor-"+runID, "auditor-pass-"+randomHex(6)
	createOperator(t, username, "auditor", password)
	a := admit(t, uniqueKey("charge:order"), 3600)

	page := newPage(t)
	failOnDialog(t, page)
	login(t, page, username, password)
	gotoPage(t, page, "/operations/"+a.OperationID)
	must(t, expect.Locator(page.GetByTestId("op-key")).ToHaveText(a.Key), "operation page")
	must(t, expect.Locator(page.GetByTestId("op-state")).ToContainText(ci("in progress")), "in progress")
	must(t, expect.Locator(page.GetByTestId("outcome-form")).ToHaveCount(0), "no outcome form")
	must(t, expect.Locator(page.GetByTestId("release-form")).ToHaveCount(0), "no release form")
	must(t, expect.Locator(page.GetByTestId("outcome-submit")).ToHaveCount(0), "no outcome button")
	must(t, expect.Locator(page.GetByTestId("release-submit")).ToHaveCount(0), "no release button")
	shot(t, page, "read-only")

	token := csrfFromPage(t, page)
	noRedirects := playwright.Int(0)
	post := func(path string, form map[string]any) int {
		t.Helper()
		resp, err := page.Request().Post(baseURL+path, playwright.APIRequestContextPostOptions{
			Form: form, MaxRedirects: noRedirects, Headers: map[string]string{"Origin": baseURL, "Referer": baseURL + "/operations/" + a.OperationID},
		})
		must(t, err, "POST "+path)
		defer resp.Dispose()
		return resp.Status()
	}
	fencing := strconv.FormatInt(a.FencingToken, 10)
	if got := post("/operations/"+a.OperationID+"/release", map[string]any{"_csrf": token,
		"operation_id": a.OperationID, "fencing_token": fencing, "reason": "crafted by hand", "confirm": "yes"}); got != http.StatusForbidden {
		t.Errorf("auditor's crafted release answered %d, want 403", got)
	}
	if got := post("/operations/"+a.OperationID+"/outcome", map[string]any{"_csrf": token,
		"status": "failed", "receipt": "", "note": "crafted by hand"}); got != http.StatusForbidden {
		t.Errorf("auditor's crafted outcome answered %d, want 403", got)
	}

	op := getOperation(t, a.OperationID)
	if op.State != "in_progress" || !op.Held || op.Outcome != nil {
		t.Errorf("after the refused POSTs the operation is %+v, want in_progress, held, no outcome", op)
	}
	for _, e := range op.Events {
		if strings.Contains(e.Actor, username) {
			t.Errorf("an event by the auditor was written: %+v", e)
		}
	}

	// The token was valid: the same session may still sign out with it, so the refusals
	// above were for the role, not for CSRF.
	if got := post("/logout", map[string]any{"_csrf": token}); got != http.StatusSeeOther {
		t.Errorf("auditor's sign-out with the page's CSRF token answered %d, want 303", got)
	}
}

// TestReleaseFailedOperation: the destination refused a charge and the service recorded
// failed but kept the key; an operator releases it from the dashboard, and the next attempt
// is admitted with the next fencing token.
func TestReleaseFailedOperation(t *testing.T) {
	key := uniqueKey("charge:declined")
	a := admit(t, key, 3600)
	recordOutcome(t, a, "failed", "decline_"+runID)

	page := newPage(t)
	failOnDialog(t, page)
	login(t, page, adminUser, adminPassword)
	gotoPage(t, page, "/operations/"+a.OperationID)
	must(t, expect.Locator(page.GetByTestId("op-state")).ToContainText(ci("failed")), "failed operation")
	must(t, page.GetByTestId("release-reason").Fill("Card declined; nothing was charged."), "fill reason")
	must(t, page.GetByTestId("release-confirm").Check(), "confirm")
	must(t, page.GetByTestId("release-submit").Click(), "release")
	must(t, expect.Locator(page.GetByTestId("flash")).ToBeVisible(), "success message")
	must(t, expect.Locator(page.GetByTestId("op-state")).ToContainText(ci("released")), "now released")
	must(t, expect.Locator(page.GetByTestId("events")).ToContainText(adminUser), "the event names the operator")
	shot(t, page, "released")

	if k := getKey(t, key); k.Held {
		t.Fatalf("key %s still held after the release: %+v", key, k)
	}
	if b := admit(t, key, 60); b.FencingToken != a.FencingToken+1 {
		t.Errorf("next admission fencing token %d, want %d", b.FencingToken, a.FencingToken+1)
	}
}
