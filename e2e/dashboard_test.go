//go:build e2e

package e2e

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/playwright-community/playwright-go"
)

// TestLogin: a wrong password keeps the operator on /login with the error; the right one
// lands on /keys showing the account.
func TestLogin(t *testing.T) {
	page := newPage(t)

	gotoPage(t, page, "/keys")
	must(t, expect.Page(page).ToHaveURL(regexp.MustCompile(`/login(\?|$)`)), "signed-out /keys redirects to /login")
	must(t, expect.Locator(page.GetByTestId("login-form")).ToBeVisible(), "login form")
	shot(t, page, "form")

	must(t, page.GetByTestId("login-username").Fill(adminUser), "fill username")
	must(t, page.GetByTestId("login-password").Fill("not-the-password"), "fill password")
	must(t, page.GetByTestId("login-submit").Click(), "submit")
	must(t, expect.Locator(page.GetByTestId("login-error")).ToHaveText("Incorrect username or password."), "error shown")
	must(t, expect.Page(page).ToHaveURL(regexp.MustCompile(`/login(\?|$)`)), "still on /login")
	must(t, expect.Locator(page.GetByTestId("account")).ToHaveCount(0), "not signed in")
	must(t, expect.Locator(page.GetByTestId("login-username")).ToHaveValue(adminUser), "username kept")
	shot(t, page, "bad-password")

	must(t, page.GetByTestId("login-password").Fill(adminPassword), "fill password")
	must(t, page.GetByTestId("login-submit").Click(), "submit")
	must(t, expect.Page(page).ToHaveURL(regexp.MustCompile(`/keys$`)), "lands on /keys")
	must(t, expect.Locator(page.GetByTestId("account-username")).ToHaveText(adminUser), "shows the username")
	must(t, expect.Locator(page.GetByTestId("login-error")).ToHaveCount(0), "no error")
	shot(t, page, "signed-in")
}

// TestKeyXSS: a key made of markup is shown as text, and no script runs.
func TestKeyXSS(t *testing.T) {
	const key = `<script>alert(1)</script>`
	acquire(t, acquireReq{Key: key, TTLSeconds: 600, Operation: "e2e-xss",
		Metadata: map[string]any{"note": `<img src=x onerror=alert(2)>`}}, http.StatusCreated, http.StatusOK)

	page := newPage(t)
	failOnDialog(t, page)
	login(t, page, adminUser, adminPassword)
	gotoPage(t, page, "/keys")

	cell := page.GetByTestId("key-name").GetByText(key, playwright.LocatorGetByTextOptions{Exact: playwright.Bool(true)})
	must(t, expect.Locator(cell).ToBeVisible(), "the key is shown as text")
	must(t, expect.Locator(page.GetByTestId("keys-table").Locator("script")).ToHaveCount(0), "no script element in the table")
	html, err := page.GetByTestId("key-name").Filter(playwright.LocatorFilterOptions{HasText: key}).First().InnerHTML()
	must(t, err, "cell HTML")
	if !strings.Contains(html, "&lt;script&gt;alert(1)&lt;/script&gt;") || strings.Contains(html, "<script") {
		t.Errorf("key cell HTML = %q, want the key escaped as text", html)
	}
	shot(t, page, "keys")
}

// TestKeysPage: keys in each state, with their badges, for docs/operations.md (Dashboard).
func TestKeysPage(t *testing.T) {
	inProgress := admit(t, uniqueKey("charge:order"), 3600)
	// Two duplicates and a conflict of the in-progress key.
	for i := 0; i < 2; i++ {
		acquire(t, acquireReq{Key: inProgress.Key, TTLSeconds: 3600, Operation: "e2e-charge", Fingerprint: "sha256:e2e"}, http.StatusOK)
	}
	acquire(t, acquireReq{Key: inProgress.Key, TTLSeconds: 3600, Operation: "e2e-charge", Fingerprint: "sha256:other"}, http.StatusUnprocessableEntity)

	succeeded := admit(t, uniqueKey("invoice:2026-11"), 3600)
	recordOutcome(t, succeeded, "succeeded", "inv_"+runID)
	failed := admit(t, uniqueKey("email:welcome"), 3600)
	recordOutcome(t, failed, "failed", "")
	uncertain := admit(t, uniqueKey("refund:order"), 3600)
	recordOutcome(t, uncertain, "uncertain", "")
	released := admit(t, uniqueKey("webhook:shipment"), 3600)
	releaseKey(t, released, "destination rejected the request before acting")

	page := newPage(t)
	login(t, page, adminUser, adminPassword)
	gotoPage(t, page, "/keys")
	for _, c := range []struct {
		a     acquireResp
		state string
	}{{inProgress, "in_progress"}, {succeeded, "succeeded"}, {failed, "failed"}, {uncertain, "uncertain"}, {released, "released"}} {
		row := rowOf(page, "key-row", c.a.Key)
		must(t, expect.Locator(row).ToHaveCount(1), "row of "+c.a.Key)
		must(t, expect.Locator(row.GetByTestId("state-badge")).ToHaveAttribute("data-state", c.state), c.a.Key+" is "+c.state)
	}
	must(t, expect.Locator(rowOf(page, "key-row", inProgress.Key).GetByTestId("key-duplicates")).ToContainText("2"), "duplicates counted")
	shot(t, page, "keys")

	_, err := page.GetByTestId("filter-state").SelectOption(playwright.SelectOptionValues{Values: &[]string{"uncertain"}})
	must(t, err, "filter uncertain")
	must(t, page.GetByTestId("filter-apply").Click(), "apply filter")
	must(t, expect.Page(page).ToHaveURL(regexp.MustCompile(`state=uncertain`)), "filter in the URL")
	must(t, expect.Locator(rowOf(page, "key-row", uncertain.Key)).ToHaveCount(1), "uncertain key listed")
	must(t, expect.Locator(rowOf(page, "key-row", succeeded.Key)).ToHaveCount(0), "succeeded key filtered out")
	shot(t, page, "uncertain")

	gotoPage(t, page, "/")
	must(t, expect.Locator(page.GetByTestId("overview-chart")).ToBeVisible(), "overview chart")
	must(t, expect.Locator(page.GetByTestId("overview-needs-reconciliation")).Not().ToHaveText("0"), "the uncertain key counts")
	shot(t, page, "overview")
}

// TestKeysAutoRefresh: the Keys table refreshes itself (htmx, every 5 s) and keeps the filter:
// a key acquired through the API while the page is open appears without a reload, and a key
// outside the filter does not.
func TestKeysAutoRefresh(t *testing.T) {
	prefix := uniqueKey("refresh")
	page := newPage(t)
	login(t, page, adminUser, adminPassword)
	gotoPage(t, page, "/keys?prefix="+url.QueryEscape(prefix))
	must(t, expect.Locator(page.GetByTestId("keys-empty")).ToHaveCount(1), "nothing matches yet")

	inside := admit(t, prefix+"/1", 3600)
	outside := admit(t, uniqueKey("elsewhere"), 3600)
	must(t, expect.Locator(rowOf(page, "key-row", inside.Key)).ToHaveCount(1, playwright.LocatorAssertionsToHaveCountOptions{
		Timeout: playwright.Float(15000)}), "the new key appears without a reload")
	must(t, expect.Locator(rowOf(page, "key-row", outside.Key)).ToHaveCount(0), "the filter still applies")
	must(t, expect.Locator(page.GetByTestId("filter-prefix")).ToHaveValue(prefix), "the filter form is untouched")
	shot(t, page, "refreshed")
}
