//go:build e2e

package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/playwright-community/playwright-go"
)

// axeSource is the vendored axe-core (static/axe/, left out of the binary's assets).
func axeSource(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "static", "axe", "axe.min.js"))
	must(t, err, "read static/axe/axe.min.js")
	return string(b)
}

// axeViolation is the part of an axe-core violation a failure message needs.
type axeViolation struct {
	ID     string
	Impact string
	Nodes  []string
}

// runAxe evaluates axe-core in the page, under the page's own Content-Security-Policy, and
// returns the violations of every rule axe runs by default (WCAG 2.x A and AA and best
// practices).
func runAxe(t *testing.T, page playwright.Page, src string) []axeViolation {
	t.Helper()
	if _, err := page.Evaluate(src); err != nil {
		t.Fatalf("load axe-core: %v", err)
	}
	res, err := page.Evaluate(`async () => {
		const r = await axe.run(document, {resultTypes: ["violations"]});
		return r.violations.map(v => ({id: v.id, impact: v.impact || "",
			nodes: v.nodes.slice(0, 5).map(n => n.target.join(" ") + " :: " + (n.failureSummary || "").split("\n").join(" "))}));
	}`)
	must(t, err, "axe.run")
	var out []axeViolation
	list, _ := res.([]any)
	for _, it := range list {
		m, _ := it.(map[string]any)
		v := axeViolation{ID: fmt.Sprint(m["id"]), Impact: fmt.Sprint(m["impact"])}
		nodes, _ := m["nodes"].([]any)
		for _, n := range nodes {
			v.Nodes = append(v.Nodes, fmt.Sprint(n))
		}
		out = append(out, v)
	}
	return out
}

// docShot saves a screenshot of a page for docs/operations.md when E2E_SCREENSHOTS is set (make
// screenshots): <dir>/<name>-<width>.png.
func docShot(t *testing.T, page playwright.Page, name, width string) {
	t.Helper()
	if os.Getenv("E2E_SCREENSHOTS") == "" {
		return
	}
	file := filepath.Join(screenshotDir, name+"-"+width+".png")
	if _, err := page.Screenshot(playwright.PageScreenshotOptions{Path: playwright.String(file), FullPage: playwright.Bool(true)}); err != nil {
		t.Errorf("screenshot %s: %v", file, err)
	}
}

// TestPagesAccessible: every page, signed out and signed in as a global admin, at a desktop
// (1280 px) and a phone (390 px) width: axe-core finds no violation, and on the phone the page
// never scrolls sideways (tables scroll inside their own focusable region).
func TestPagesAccessible(t *testing.T) {
	src := axeSource(t)
	// Data for every page: an uncertain operation (queue, operation page with the outcome
	// form), a duplicate attempt (audit), a bulk job (job page).
	w := newTenantWorld(t, "operator")
	u := w.uncertain(t, "a11y:uncertain-"+randomHex(2))
	dup := admit(t, uniqueKey("a11y:dup"), 3600)
	acquire(t, acquireReq{Key: dup.Key, TTLSeconds: 3600, Operation: "e2e-charge", Fingerprint: "sha256:e2e"}, http.StatusOK)
	bulkTarget := w.uncertain(t, "a11y:bulk-"+randomHex(2))
	var job struct {
		ID string `json:"id"`
	}
	if st := w.call(t, http.MethodPost, "/v1/reconciliations", map[string]any{"job_id": "a11y-" + randomHex(3), "status": "failed",
		"note": "checked", "operation_ids": []string{bulkTarget.OperationID}}, &job); st != http.StatusCreated {
		t.Fatalf("bulk job: %d", st)
	}

	pages := []struct{ name, path string }{
		{"overview", "/"},
		{"overview-7d", "/?range=7d"},
		{"keys", "/keys"},
		{"queue", "/reconciliation"},
		{"operation", "/operations/" + u.OperationID + "?back=%2Freconciliation"},
		{"operation-done", "/operations/" + dup.OperationID},
		{"job", "/reconciliation/jobs/" + job.ID},
		{"audit", "/audit"},
		{"webhooks", "/webhooks"},
		{"admin", "/admin"},
		{"explore-start", "/explore"},
		{"not-found", "/operations/00000000-0000-0000-0000-000000000000"},
	}
	widths := []struct {
		name   string
		width  int
		height int
	}{{"desktop", 1280, 860}, {"mobile", 390, 844}}

	page := newPage(t)
	check := func(t *testing.T, name string, width int, widthName string) {
		t.Helper()
		if vs := runAxe(t, page, src); len(vs) > 0 {
			var b strings.Builder
			for _, v := range vs {
				fmt.Fprintf(&b, "\n  %s (%s):", v.ID, v.Impact)
				for _, n := range v.Nodes {
					fmt.Fprintf(&b, "\n    %s", n)
				}
			}
			t.Errorf("%s at %d px: %d axe violations:%s", name, width, len(vs), b.String())
		}
		if width <= 390 {
			sw, err := page.Evaluate(`() => document.scrollingElement.scrollWidth`)
			must(t, err, "scrollWidth")
			n := 0
			switch v := sw.(type) {
			case int:
				n = v
			case float64:
				n = int(v)
			}
			if n > width {
				t.Errorf("%s at %d px: the page is %d px wide (scrolls sideways)", name, width, n)
			}
			// The identifying column stays readable (issue 28: keys wrapped 3-6 characters a
			// line): its cells are at least 150 px wide, about 18 characters, the table
			// scrolling sideways in its region instead.
			narrowest, err := page.Evaluate(`() => Math.min(1e9, ...Array.from(document.querySelectorAll("td.cell-key, td.cell-url"), e => e.getBoundingClientRect().width))`)
			must(t, err, "key cell widths")
			if w, ok := narrowest.(float64); ok && w < 150 {
				t.Errorf("%s at %d px: a key or URL cell is %.0f px wide", name, width, w)
			} else if i, ok := narrowest.(int); ok && i < 150 {
				t.Errorf("%s at %d px: a key or URL cell is %d px wide", name, width, i)
			}
		}
		docShot(t, page, name, widthName)
	}

	for _, wd := range widths {
		must(t, page.SetViewportSize(wd.width, wd.height), "viewport")
		// Signed out: the sign-in page.
		must(t, page.Context().ClearCookies(), "sign out")
		gotoPage(t, page, "/login")
		check(t, "login", wd.width, wd.name)
		login(t, page, adminUser, adminPassword)
		for _, p := range pages {
			resp, err := page.Goto(p.path)
			must(t, err, "goto "+p.path)
			if p.name != "not-found" && (resp == nil || resp.Status() != http.StatusOK) {
				t.Fatalf("GET %s: %v", p.path, resp)
			}
			check(t, p.name, wd.width, wd.name)
		}
	}
}
