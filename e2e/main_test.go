//go:build e2e

// Package e2e drives the dashboard in a real browser: Debian's Chromium through
// playwright-go, against the idemgate binary built from this repository and serving a
// throwaway PostgreSQL database. Run it with `make e2e` (or `make test`), which first runs
// e2e/setup.sh to put Chromium and the playwright driver in place; the tests never
// download anything and fail, never skip, when something is missing.
//
// Screenshots of every test go to $E2E_SCREENSHOTS (a path relative to the repository
// root, default e2e/screenshots).
package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemgate/idemgate/internal/testkit"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/playwright-community/playwright-go"
)

const (
	chromiumPath = "/usr/bin/chromium"
	adminUser    = "admin"
	// expectTimeoutMs bounds every auto-waiting assertion.
	expectTimeoutMs = 10_000
)

// Set by TestMain, read by every test.
var (
	repoRoot      string
	binPath       string // the idemgate binary built from the repository
	databaseURL   string // the throwaway PostgreSQL database the server uses
	baseURL       string // http://127.0.0.1:<port>
	apiKey        string // IDEMGATE_BOOTSTRAP_API_KEY, tenant "default"
	adminPassword string // IDEMGATE_ADMIN_PASSWORD of the account "admin"
	screenshotDir string
	browser       playwright.Browser
	expect        playwright.PlaywrightAssertions
	runID         string // distinguishes this run's keys and accounts
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

// failSetup reports why the browser tests cannot run at all. It never skips: a missing
// browser or driver is a failure that names the script that fixes it.
func failSetup(format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "\nFAIL: e2e: "+format+"\n\n", args...)
	return 1
}

func runMain(m *testing.M) int {
	wd, err := os.Getwd()
	if err != nil {
		return failSetup("%v", err)
	}
	repoRoot = filepath.Dir(wd) // go test runs in e2e/
	runID = randomHex(4)
	apiKey = "e2e_" + randomHex(16)
	adminPassword = "e2e-admin-" + randomHex(8)

	screenshotDir = os.Getenv("E2E_SCREENSHOTS")
	if screenshotDir == "" {
		screenshotDir = filepath.Join("e2e", "screenshots")
	}
	if !filepath.IsAbs(screenshotDir) {
		screenshotDir = filepath.Join(repoRoot, screenshotDir)
	}
	if err := os.MkdirAll(screenshotDir, 0o755); err != nil {
		return failSetup("screenshot folder: %v", err)
	}

	// The browser and the driver first: they are what a fresh machine lacks.
	driverDir, err := checkDriver()
	if err != nil {
		return failSetup("%v\nRun `bash e2e/setup.sh` (or `make e2e`) to install Chromium and the playwright driver.", err)
	}
	if _, err := os.Stat(chromiumPath); err != nil {
		return failSetup("Chromium is missing at %s: %v\nRun `bash e2e/setup.sh` (or `make e2e`) to install it from Debian.", chromiumPath, err)
	}

	tmp, err := os.MkdirTemp("", "idemgate-e2e-")
	if err != nil {
		return failSetup("%v", err)
	}
	defer os.RemoveAll(tmp)

	if binPath, err = testkit.Build(tmp); err != nil {
		return failSetup("%v", err)
	}

	var drop func()
	databaseURL, drop, err = modeltest.CreatePostgres()
	if err != nil {
		return failSetup("cannot create a PostgreSQL database: %v\n"+
			"The tests need PostgreSQL (TEST_DATABASE_URL, default %s); `make test` starts it.", err, modeltest.DefaultAdminURL)
	}
	defer drop()

	stopServer, err := startServer()
	if err != nil {
		return failSetup("cannot start idemgate: %v", err)
	}
	defer stopServer()

	pw, err := playwright.Run(&playwright.RunOptions{DriverDirectory: driverDir, SkipInstallBrowsers: true, Verbose: false})
	if err != nil {
		return failSetup("cannot start the playwright driver in %s: %v\nRun `bash e2e/setup.sh` to (re)build it.", driverDir, err)
	}
	defer func() { _ = pw.Stop() }()
	browser, err = pw.Chromium.Launch(playwright.BrowserTypeLaunchOptions{
		ExecutablePath: playwright.String(chromiumPath),
		Headless:       playwright.Bool(true),
		Args: []string{"--disable-gpu", "--disable-sync", "--disable-quic",
			"--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1"},
	})
	if err != nil {
		return failSetup("cannot launch %s: %v\nRun `bash e2e/setup.sh` to install Chromium.", chromiumPath, err)
	}
	defer func() { _ = browser.Close() }()
	expect = playwright.NewPlaywrightAssertions(expectTimeoutMs)

	return m.Run()
}

// checkDriver returns the playwright driver directory playwright-go would use
// ($PLAYWRIGHT_DRIVER_PATH, else $HOME/.cache/ms-playwright-go/<version>) after checking
// that e2e/setup.sh has filled it. playwright.Run would otherwise leave an empty directory
// and a vaguer error.
func checkDriver() (string, error) {
	d, err := playwright.NewDriver(&playwright.RunOptions{SkipInstallBrowsers: true})
	if err != nil {
		return "", err
	}
	dir := os.Getenv("PLAYWRIGHT_DRIVER_PATH")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(home, ".cache", "ms-playwright-go", d.Version)
	}
	for _, f := range []string{"node", filepath.Join("package", "cli.js")} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return "", fmt.Errorf("the playwright driver %s is not installed: %s is missing", d.Version, filepath.Join(dir, f))
		}
	}
	return dir, nil
}

// startServer runs `idemgate serve` on a free port of 127.0.0.1 and waits for /healthz.
func startServer() (stop func(), err error) {
	addr, err := testkit.PickAddr()
	if err != nil {
		return nil, err
	}
	baseURL = "http://" + addr
	p := testkit.NewProc(binPath, addr, append(os.Environ(),
		"DATABASE_URL="+databaseURL,
		"IDEMGATE_ADMIN_PASSWORD="+adminPassword,
		"IDEMGATE_BOOTSTRAP_API_KEY="+apiKey,
		"IDEMGATE_REAP_INTERVAL=1s",
		"IDEMGATE_LOG_FORMAT=json",
		"IDEMGATE_SHUTDOWN_TIMEOUT=3s",
	)...)
	if err := p.Start(); err != nil {
		return nil, err
	}
	return func() {
		_ = p.Stop(10 * time.Second)
		if os.Getenv("E2E_SERVER_LOG") != "" {
			fmt.Fprintf(os.Stderr, "--- idemgate server log ---\n%s", p.Log.String())
		}
	}, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// uniqueKey returns a key of this run: tests share one database.
func uniqueKey(prefix string) string { return prefix + ":" + runID + "-" + randomHex(3) }

// ---- browser helpers ---------------------------------------------------------

// newPage opens a fresh browser context (own cookies) and a page in it. When the test
// fails, a screenshot of the page as it was is saved as <Test>-failure.png.
func newPage(t *testing.T) playwright.Page {
	t.Helper()
	ctx, err := browser.NewContext(playwright.BrowserNewContextOptions{
		BaseURL:         playwright.String(baseURL),
		Viewport:        &playwright.Size{Width: 1280, Height: 860},
		AcceptDownloads: playwright.Bool(true),
		Locale:          playwright.String("en-GB"),
		TimezoneId:      playwright.String("UTC"),
	})
	must(t, err, "new browser context")
	page, err := ctx.NewPage()
	must(t, err, "new page")
	page.SetDefaultTimeout(expectTimeoutMs)
	page.OnPageError(func(e error) { t.Logf("page error: %v", e) })
	page.OnConsole(func(m playwright.ConsoleMessage) {
		if m.Type() != "error" {
			return
		}
		// A Content-Security-Policy violation means a page feature silently does not work
		// (htmx evaluating a trigger filter was one); fail rather than log it.
		if txt := m.Text(); strings.Contains(txt, "Content Security Policy") || strings.Contains(txt, "EvalError") {
			t.Errorf("CSP violation in the browser: %s", txt)
		} else {
			t.Logf("console error: %s", txt)
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			shot(t, page, "failure")
		}
		_ = ctx.Close()
	})
	return page
}

// shot saves a full-page screenshot as <screenshotDir>/<TestName>-<name>.png.
func shot(t *testing.T, page playwright.Page, name string) {
	t.Helper()
	file := filepath.Join(screenshotDir, strings.ReplaceAll(t.Name(), "/", "_")+"-"+name+".png")
	if _, err := page.Screenshot(playwright.PageScreenshotOptions{Path: playwright.String(file), FullPage: playwright.Bool(true)}); err != nil {
		t.Errorf("screenshot %s: %v", file, err)
		return
	}
	t.Logf("screenshot: %s", file)
}

// gotoPage opens a path of the dashboard and checks the answer's status.
func gotoPage(t *testing.T, page playwright.Page, path string) {
	t.Helper()
	resp, err := page.Goto(path)
	must(t, err, "goto "+path)
	if resp == nil || resp.Status() >= 400 {
		status := 0
		if resp != nil {
			status = resp.Status()
		}
		t.Fatalf("GET %s answered %d", path, status)
	}
}

// login signs in through the /login form and waits until the dashboard shows the account.
func login(t *testing.T, page playwright.Page, username, password string) {
	t.Helper()
	gotoPage(t, page, "/login")
	must(t, page.GetByTestId("login-username").Fill(username), "fill username")
	must(t, page.GetByTestId("login-password").Fill(password), "fill password")
	must(t, page.GetByTestId("login-submit").Click(), "submit login")
	must(t, expect.Locator(page.GetByTestId("account-username")).ToHaveText(username), "signed in as "+username)
}

// rowOf is the table row (data-testid rowTestID) that contains text.
func rowOf(page playwright.Page, rowTestID, text string) playwright.Locator {
	return page.GetByTestId(rowTestID).Filter(playwright.LocatorFilterOptions{HasText: text})
}

// csrfFromPage reads the CSRF token of the signed-in page from its sign-out form.
func csrfFromPage(t *testing.T, page playwright.Page) string {
	t.Helper()
	v, err := page.GetByTestId("logout-form").Locator("input[name=_csrf]").InputValue()
	must(t, err, "read the CSRF token")
	if v == "" {
		t.Fatal("the sign-out form carries no CSRF token")
	}
	return v
}

func must(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func ci(s string) *regexp.Regexp { return regexp.MustCompile("(?i)" + regexp.QuoteMeta(s)) }

// ---- accounts ------------------------------------------------------------------

// createOperator adds a dashboard account with the built binary, as an administrator would.
func createOperator(t *testing.T, username, role, password string) {
	t.Helper()
	cmd := exec.Command(binPath, "operator", "create", "--username", username, "--role", role)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+databaseURL, "IDEMGATE_PASSWORD="+password, "IDEMGATE_LOG_FORMAT=json")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("idemgate operator create --username %s --role %s: %v\n%s", username, role, err, out)
	}
}

// ---- JSON API client ---------------------------------------------------------

type acquireReq struct {
	Key         string         `json:"key"`
	TTLSeconds  int            `json:"ttl_seconds"`
	Operation   string         `json:"operation,omitempty"`
	Fingerprint string         `json:"fingerprint,omitempty"`
	AttemptID   string         `json:"attempt_id,omitempty"`
	Metadata    map[string]any `json:"metadata,omitempty"`
}

type acquireResp struct {
	Admitted     bool   `json:"admitted"`
	Key          string `json:"key"`
	OperationID  string `json:"operation_id"`
	OwnerToken   string `json:"owner_token"`
	FencingToken int64  `json:"fencing_token"`
	State        string `json:"state"`
	// Operation is set on a duplicate (200).
	Operation *apiOperation `json:"operation"`
	Code      string        `json:"code"`
}

type apiOperation struct {
	ID           string `json:"id"`
	Key          string `json:"key"`
	State        string `json:"state"`
	FencingToken int64  `json:"fencing_token"`
	Held         bool   `json:"held"`
	Outcome      *struct {
		Status     string  `json:"status"`
		Receipt    *string `json:"receipt"`
		Note       *string `json:"note"`
		RecordedBy string  `json:"recorded_by"`
	} `json:"outcome"`
	Events []struct {
		Kind   string `json:"kind"`
		Actor  string `json:"actor"`
		Detail string `json:"detail"`
	} `json:"events"`
}

type keyView struct {
	Key       string        `json:"key"`
	Held      bool          `json:"held"`
	Operation *apiOperation `json:"operation"`
}

var apiClient = &http.Client{Timeout: 10 * time.Second}

// api calls the JSON API with the bootstrap API key and decodes the answer into out (when
// not nil). It returns the status.
func api(t *testing.T, method, path string, body, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		must(t, err, "encode request")
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, baseURL+path, rd)
	must(t, err, "new request")
	req.Header.Set("Authorization", "Bearer "+apiKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := apiClient.Do(req)
	must(t, err, method+" "+path)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(t, err, "read "+method+" "+path)
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %d, undecodable body %q: %v", method, path, resp.StatusCode, b, err)
		}
	}
	return resp.StatusCode
}

// acquire calls POST /v1/acquire and checks the status is one of want.
func acquire(t *testing.T, in acquireReq, want ...int) acquireResp {
	t.Helper()
	var out acquireResp
	status := api(t, http.MethodPost, "/v1/acquire", in, &out)
	for _, w := range want {
		if status == w {
			return out
		}
	}
	t.Fatalf("acquire %q: status %d (code %q), want %v", in.Key, status, out.Code, want)
	return out
}

// admit acquires a new key and returns the admitted operation.
func admit(t *testing.T, key string, ttl int) acquireResp {
	t.Helper()
	a := acquire(t, acquireReq{Key: key, TTLSeconds: ttl, Operation: "e2e-charge",
		Fingerprint: "sha256:e2e", Metadata: map[string]any{"test": t.Name()}}, http.StatusCreated)
	if !a.Admitted || a.OperationID == "" {
		t.Fatalf("acquire %q: not admitted: %+v", key, a)
	}
	return a
}

func recordOutcome(t *testing.T, a acquireResp, status, receipt string) {
	t.Helper()
	body := map[string]any{"owner_token": a.OwnerToken, "status": status}
	if receipt != "" {
		body["receipt"] = receipt
		body["response"] = map[string]any{"status": 201, "body": map[string]any{"receipt": receipt}}
	}
	if got := api(t, http.MethodPost, "/v1/operations/"+a.OperationID+"/outcome", body, nil); got != http.StatusOK {
		t.Fatalf("outcome %s of %s: status %d", status, a.Key, got)
	}
}

func releaseKey(t *testing.T, a acquireResp, reason string) {
	t.Helper()
	body := map[string]any{"key": a.Key, "owner_token": a.OwnerToken, "reason": reason}
	if got := api(t, http.MethodPost, "/v1/release", body, nil); got != http.StatusOK {
		t.Fatalf("release %s: status %d", a.Key, got)
	}
}

func getOperation(t *testing.T, id string) apiOperation {
	t.Helper()
	var op apiOperation
	if got := api(t, http.MethodGet, "/v1/operations/"+url.PathEscape(id), nil, &op); got != http.StatusOK {
		t.Fatalf("GET /v1/operations/%s: status %d", id, got)
	}
	return op
}

func getKey(t *testing.T, key string) keyView {
	t.Helper()
	var k keyView
	if got := api(t, http.MethodGet, "/v1/keys/"+url.PathEscape(key), nil, &k); got != http.StatusOK {
		t.Fatalf("GET /v1/keys/%s: status %d", key, got)
	}
	return k
}

// eventually polls cond through the API until it holds, at most for limit. It is for
// server-side time (TTLs, the reaper), where the browser has nothing to wait on.
func eventually(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	tick := time.NewTicker(150 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waited %s for %s", limit, what)
		case <-tick.C:
		}
	}
}

// failOnDialog makes any alert/confirm/prompt a test failure (and dismisses it).
func failOnDialog(t *testing.T, page playwright.Page) {
	page.OnDialog(func(d playwright.Dialog) {
		t.Errorf("a JavaScript dialog opened: %s %q", d.Type(), d.Message())
		_ = d.Dismiss()
	})
}
