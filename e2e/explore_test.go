//go:build e2e

package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/playwright-community/playwright-go"
)

// TestExplorePlayback walks the Explore page's playback as an auditor on a phone (390 px):
// Explore is in the navigation, "Next step" plays the eight steps with the statuses
// docs/reference.md gives, the page never scrolls sideways and axe finds no violation at the
// start and at the end, and "Reset playback" starts again in a new tenant. With E2E_SCREENSHOTS
// set (make screenshots) it saves the finished playback for the README.
func TestExplorePlayback(t *testing.T) {
	src := axeSource(t)
	user := "explore-" + randomHex(3)
	createOperator(t, user, "auditor", "explore-password-1")
	page := newPage(t)
	must(t, page.SetViewportSize(390, 844), "viewport")
	login(t, page, user, "explore-password-1")

	must(t, page.GetByTestId("nav-explore").Click(), "open Explore")
	must(t, expect.Locator(page.GetByTestId("explore-progress")).ToHaveText("Not started: press Next step"), "the start")
	must(t, expect.Locator(page.GetByTestId("explore-sandbox")).ToContainText("Sandbox"), "the sandbox is marked")
	requireAccessible(t, page, src, "explore start")

	// The answers' statuses, step by step, as the reference gives them.
	want := map[int][]string{1: {"201"}, 2: {"200"}, 3: {"422"}, 4: {"200"}, 5: {"201"}, 6: {"200", "200"}, 7: {"409"},
		8: {"303", "200", "200"}}
	var tenant string
	for n := 1; n <= 8; n++ {
		must(t, page.GetByTestId("explore-next").Click(), fmt.Sprintf("Next step %d", n))
		must(t, expect.Locator(page.GetByTestId("explore-progress")).ToHaveText("Step "+strconv.Itoa(n)+" of 8"), "step shown")
		step := page.GetByTestId("explore-step-" + strconv.Itoa(n))
		must(t, expect.Locator(step).ToBeInViewport(), "the page scrolls to the new step")
		answers, err := step.GetByTestId("explore-answer").All()
		must(t, err, "answers")
		var got []string
		for _, a := range answers {
			s, err := a.GetAttribute("data-status")
			must(t, err, "status")
			got = append(got, s)
		}
		if strings.Join(got, ",") != strings.Join(want[n], ",") {
			t.Fatalf("step %d answered %v, want %v", n, got, want[n])
		}
		k, err := page.GetByTestId("explore-tenant").TextContent()
		must(t, err, "tenant")
		if tenant == "" {
			tenant = k
		} else if k != tenant {
			t.Fatalf("step %d shows tenant %q, the playback's is %q", n, k, tenant)
		}
	}
	must(t, expect.Locator(page.GetByTestId("explore-step-5").GetByTestId("explore-answer")).ToContainText("previous_operation"),
		"the retry carries the warning")
	must(t, expect.Locator(page.GetByTestId("explore-step-7").GetByTestId("explore-answer")).ToContainText("not_owner"),
		"the late release is refused")
	must(t, expect.Locator(page.GetByTestId("explore-done")).ToBeVisible(), "the end")
	requireAccessible(t, page, src, "explore after step 8")
	docShot(t, page, "explore", "mobile")
	must(t, page.SetViewportSize(1280, 860), "viewport")
	docShot(t, page, "explore", "desktop")

	must(t, page.GetByTestId("explore-reset").Click(), "Reset playback")
	must(t, expect.Locator(page.GetByTestId("explore-progress")).ToHaveText("Not started: press Next step"), "back at the start")
	must(t, page.GetByTestId("explore-next").Click(), "Next step after the reset")
	must(t, expect.Locator(page.GetByTestId("explore-progress")).ToHaveText("Step 1 of 8"), "step 1 again")
	if k, err := page.GetByTestId("explore-tenant").TextContent(); err != nil || k == tenant {
		t.Fatalf("after the reset the tenant is %q (%v), the old one was %q", k, err, tenant)
	}
}

// requireAccessible fails the test on any axe violation, or when the page scrolls sideways at
// its current width.
func requireAccessible(t *testing.T, page playwright.Page, src, what string) {
	t.Helper()
	if vs := runAxe(t, page, src); len(vs) > 0 {
		t.Errorf("%s: %d axe violations: %+v", what, len(vs), vs)
	}
	wide, err := page.Evaluate(`() => document.scrollingElement.scrollWidth > window.innerWidth`)
	must(t, err, "widths")
	if wide == true {
		t.Errorf("%s: the page is wider than its window (scrolls sideways)", what)
	}
}
