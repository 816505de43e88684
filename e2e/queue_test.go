//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/playwright-community/playwright-go"
)

// tenantWorld is a tenant of its own with an API key and a restricted operator, so a test's
// reconciliation queue holds only its own operations on the shared database.
type tenantWorld struct {
	tenant   string
	apiKey   string
	operator string
	password string
}

// newTenantWorld creates the tenant's API key and operator with the built binary, as an
// administrator would.
func newTenantWorld(t *testing.T, role string) tenantWorld {
	t.Helper()
	w := tenantWorld{tenant: "e2e-" + runID + "-" + randomHex(2), operator: "op-" + randomHex(4), password: "pw-" + randomHex(8)}
	env := append(os.Environ(), "DATABASE_URL="+databaseURL, "IDEMGATE_LOG_FORMAT=json")
	cmd := exec.Command(binPath, "apikey", "create", "--tenant", w.tenant)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("idemgate apikey create: %v\n%s", err, errb.String())
	}
	w.apiKey = strings.TrimSpace(out.String())
	cmd = exec.Command(binPath, "operator", "create", "--username", w.operator, "--role", role, "--tenant", w.tenant)
	cmd.Env = append(env, "IDEMGATE_PASSWORD="+w.password)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("idemgate operator create: %v\n%s", err, b)
	}
	return w
}

// call is the JSON API with the world's API key; it returns the status and decodes into out.
func (w tenantWorld) call(t *testing.T, method, path string, body, out any) int {
	t.Helper()
	b, err := json.Marshal(body)
	must(t, err, "encode")
	req, err := http.NewRequest(method, baseURL+path, bytes.NewReader(b))
	must(t, err, "request")
	req.Header.Set("Authorization", "Bearer "+w.apiKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := apiClient.Do(req)
	must(t, err, method+" "+path)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	must(t, err, "read")
	if out != nil {
		must(t, json.Unmarshal(raw, out), "decode "+string(raw))
	}
	return resp.StatusCode
}

// uncertain admits key in the world's tenant and has the owner report the outcome uncertain.
func (w tenantWorld) uncertain(t *testing.T, key string) acquireResp {
	t.Helper()
	var a acquireResp
	if st := w.call(t, http.MethodPost, "/v1/acquire", acquireReq{Key: key, TTLSeconds: 3600, Operation: "e2e-charge"}, &a); st != http.StatusCreated {
		t.Fatalf("acquire %s: %d", key, st)
	}
	if st := w.call(t, http.MethodPost, "/v1/operations/"+a.OperationID+"/outcome",
		map[string]any{"owner_token": a.OwnerToken, "status": "uncertain"}, nil); st != http.StatusOK {
		t.Fatalf("outcome uncertain %s: %d", key, st)
	}
	a.Key = key
	return a
}

// actions counts what the operator does in the browser: clicks and form submissions.
type actions struct {
	t *testing.T
	n int
}

func (a *actions) click(l playwright.Locator, what string) {
	a.t.Helper()
	a.n++
	must(a.t, l.Click(), what)
}

// TestReconcileInThreeActions: from the overview, an operator reconciles the oldest uncertain
// operation in at most three actions (Reconcile next, choose the outcome, submit; typing the
// note is not a click) and lands on the next queue item with a flash; the last one lands on the
// empty queue. The back link keeps the queue.
func TestReconcileInThreeActions(t *testing.T) {
	w := newTenantWorld(t, "operator")
	first := w.uncertain(t, "flow:first-"+randomHex(2))
	second := w.uncertain(t, "flow:second-"+randomHex(2))

	page := newPage(t)
	failOnDialog(t, page)
	login(t, page, w.operator, w.password)
	gotoPage(t, page, "/")
	must(t, expect.Locator(page.GetByTestId("overview-needs-count")).ToHaveText("2"), "two need reconciliation")

	act := &actions{t: t}
	act.click(page.GetByTestId("overview-reconcile-next"), "Reconcile next")
	must(t, expect.Locator(page.GetByTestId("op-key")).ToHaveText(first.Key), "the oldest first")
	must(t, expect.Locator(page.GetByTestId("op-back")).ToHaveText("← Queue"), "back to the queue")
	form := page.GetByTestId("outcome-form")
	box, err := form.BoundingBox()
	must(t, err, "form position")
	if box == nil || box.Y+box.Height > 860 {
		t.Errorf("the outcome form is not above the fold: %+v", box)
	}
	act.click(page.GetByTestId("outcome-status-failed"), "choose failed")
	must(t, form.Locator("textarea[name=note]").Fill("PSP says declined"), "type the note")
	act.click(page.GetByTestId("outcome-submit"), "submit")

	must(t, expect.Locator(page.GetByTestId("op-key")).ToHaveText(second.Key), "lands on the next item")
	must(t, expect.Locator(page.GetByTestId("flash")).ToHaveText("Recorded failed for "+first.Key+" — next: "+second.Key+"."), "flash")
	if act.n > 3 {
		t.Fatalf("reconciling took %d actions, want at most 3", act.n)
	}
	t.Logf("reconciled the first uncertain operation in %d actions", act.n)

	act.n = 0
	act.click(page.GetByTestId("outcome-status-succeeded"), "choose succeeded")
	must(t, page.GetByTestId("outcome-form").Locator("textarea[name=note]").Fill("found it in the ledger"), "type the note")
	act.click(page.GetByTestId("outcome-submit"), "submit")
	must(t, expect.Locator(page.GetByTestId("queue-empty")).ToBeVisible(), "the empty queue")
	must(t, expect.Locator(page.GetByTestId("flash")).ToContainText("the queue is empty"), "flash")
	if act.n > 2 {
		t.Fatalf("the next item took %d actions, want 2", act.n)
	}
	if op := getOperationAs(t, w, first.OperationID); op.State != "failed" || op.Outcome == nil || op.Outcome.RecordedBy != w.operator {
		t.Errorf("first is %+v, want failed by %s", op, w.operator)
	}
}

// TestBulkReconcileBrowser: select two queue rows, choose failed, type the note, submit: the
// job page lists both done.
func TestBulkReconcileBrowser(t *testing.T) {
	w := newTenantWorld(t, "operator")
	a := w.uncertain(t, "bulk:a-"+randomHex(2))
	b := w.uncertain(t, "bulk:b-"+randomHex(2))
	page := newPage(t)
	failOnDialog(t, page)
	login(t, page, w.operator, w.password)
	gotoPage(t, page, "/reconciliation")
	must(t, expect.Locator(page.GetByTestId("queue-row")).ToHaveCount(2), "two rows")
	// The form sits above the table, says how many rows are ticked, and "select every row on
	// this page" ticks them all (issue 28 item 12).
	formBox, err := page.GetByTestId("bulk-section").BoundingBox()
	must(t, err, "bulk form box")
	tableBox, err := page.GetByTestId("queue-table").BoundingBox()
	must(t, err, "table box")
	if formBox.Y > tableBox.Y {
		t.Errorf("the bulk form is at y=%.0f, below the table at y=%.0f", formBox.Y, tableBox.Y)
	}
	must(t, expect.Locator(page.GetByTestId("bulk-count")).ToHaveText("0 selected"), "none ticked")
	must(t, page.GetByTestId("queue-select").Nth(0).Check(), "select a")
	must(t, expect.Locator(page.GetByTestId("bulk-count")).ToHaveText("1 selected"), "one ticked")
	must(t, page.GetByTestId("queue-select-all").Check(), "select every row on the page")
	must(t, expect.Locator(page.GetByTestId("bulk-count")).ToHaveText("2 selected"), "both ticked")
	must(t, expect.Locator(page.GetByTestId("queue-select").Nth(1)).ToBeChecked(), "b ticked by select-all")
	must(t, page.GetByTestId("bulk-status-failed").Check(), "failed")
	must(t, page.GetByTestId("bulk-note").Fill("bank export: both declined"), "note")
	must(t, page.GetByTestId("bulk-submit").Click(), "submit")
	must(t, expect.Locator(page.Locator("[data-testid=job-row][data-result=done]")).ToHaveCount(2), "both done")
	must(t, expect.Locator(page.GetByTestId("job-actor")).ToHaveText(w.operator), "recorded as the operator")
	must(t, expect.Locator(page.GetByTestId("job-key")).ToHaveText([]string{a.Key, b.Key}), "the job lists keys")
	for _, x := range []acquireResp{a, b} {
		if op := getOperationAs(t, w, x.OperationID); op.State != "failed" {
			t.Errorf("%s is %s, want failed", x.Key, op.State)
		}
	}
}

// getOperationAs reads operation id through the world's API key.
func getOperationAs(t *testing.T, w tenantWorld, id string) apiOperation {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, baseURL+"/v1/operations/"+id, nil)
	must(t, err, "request")
	req.Header.Set("Authorization", "Bearer "+w.apiKey)
	resp, err := apiClient.Do(req)
	must(t, err, "GET operation")
	defer resp.Body.Close()
	var op apiOperation
	must(t, json.NewDecoder(resp.Body).Decode(&op), "decode operation")
	return op
}
