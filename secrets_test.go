package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSecretsNeverLogged (issue 4 point 4): a full run with generated bootstrap secrets, API
// calls, dashboard sign-ins and `apikey create`; afterwards the server's whole log is scanned
// for every secret the run created or sent. The generated admin password and API key appear
// exactly once, in the startup lines that announce them (docs/reference.md §7); nothing else ever does.
func TestSecretsNeverLogged(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "secrets.db")
	// Empty values override startServer's fixed secrets, so both are generated.
	s := startServer(t, "IDEMGATE_SQLITE_PATH="+dbPath, "IDEMGATE_BOOTSTRAP_API_KEY=", "IDEMGATE_ADMIN_PASSWORD=")

	// The generated secrets, from the lines that announce them. The server has written them
	// before it answered /healthz, but the pipe from the child may not have reached s.Log yet.
	var apiKey, adminPassword string
	for deadline := time.Now().Add(10 * time.Second); (apiKey == "" || adminPassword == "") && time.Now().Before(deadline); {
		complete := s.Log.String()
		complete = complete[:strings.LastIndexByte(complete, '\n')+1] // whole lines only
		for _, rec := range logRecords(t, complete) {
			if v, ok := rec["api_key"].(string); ok {
				apiKey = v
			}
			if v, ok := rec["password"].(string); ok {
				adminPassword = v
			}
		}
		if apiKey == "" || adminPassword == "" {
			time.Sleep(20 * time.Millisecond)
		}
	}
	require.NotEmpty(t, apiKey, "the generated API key is announced at start")
	require.NotEmpty(t, adminPassword, "the generated admin password is announced at start")

	// secrets the run must never log, by name for the failure message.
	secrets := map[string]string{}
	random := func(prefix string) string {
		b := make([]byte, 12)
		_, _ = rand.Read(b)
		return prefix + hex.EncodeToString(b)
	}

	// JSON API: acquire, outcome, release, a wrong owner token, a bad key.
	st, acq := postAs(t, apiKey, s.url+"/v1/acquire", map[string]any{"key": "secret-a", "ttl_seconds": 60})
	require.Equal(t, http.StatusCreated, st, "%v", acq)
	ownerA := acq["owner_token"].(string)
	secrets["owner token A"] = ownerA
	st, body := postAs(t, apiKey, s.url+"/v1/operations/"+acq["operation_id"].(string)+"/outcome",
		map[string]any{"owner_token": ownerA, "status": "succeeded", "receipt": "r-1"})
	require.Equal(t, http.StatusOK, st, "%v", body)

	st, acqB := postAs(t, apiKey, s.url+"/v1/acquire", map[string]any{"key": "secret-b", "ttl_seconds": 60})
	require.Equal(t, http.StatusCreated, st, "%v", acqB)
	secrets["owner token B"] = acqB["owner_token"].(string)
	wrongOwner := random("ot_")
	secrets["wrong owner token"] = wrongOwner
	st, body = postAs(t, apiKey, s.url+"/v1/release", map[string]any{"key": "secret-b", "owner_token": wrongOwner})
	require.Equal(t, http.StatusConflict, st, "%v", body)
	st, body = postAs(t, apiKey, s.url+"/v1/release", map[string]any{"key": "secret-b", "owner_token": acqB["owner_token"]})
	require.Equal(t, http.StatusOK, st, "%v", body)
	st, body = postAs(t, apiKey, s.url+"/v1/operations/"+acqB["operation_id"].(string)+"/outcome",
		map[string]any{"owner_token": wrongOwner, "status": "failed"})
	require.Equal(t, http.StatusForbidden, st, "%v", body)

	badKey := random("idg_bad_")
	secrets["refused API key"] = badKey
	st, body = postAs(t, badKey, s.url+"/v1/acquire", map[string]any{"key": "secret-c", "ttl_seconds": 60})
	require.Equal(t, http.StatusUnauthorized, st, "%v", body)

	// apikey create through the binary: the secret is printed on stdout only.
	cmd := exec.Command(binary, "apikey", "create", "--tenant", "secrets-tenant", "--label", "secrets test")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "IDEMGATE_SQLITE_PATH=" + dbPath,
		"IDEMGATE_LOG_FORMAT=json"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), stderr.String())
	created := strings.TrimSpace(stdout.String())
	require.NotEmpty(t, created)
	require.NotContains(t, stderr.String(), created, "apikey create logs nothing secret")
	secrets["created API key"] = created
	st, body = postAs(t, created, s.url+"/v1/acquire", map[string]any{"key": "secret-d", "ttl_seconds": 60})
	require.Equal(t, http.StatusCreated, st, "%v", body)
	secrets["owner token D"] = body["owner_token"].(string)

	// Dashboard: a refused sign-in with a password, then the admin's real sign-in.
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	wrongPassword := random("wrong-password-")
	secrets["wrong password"] = wrongPassword
	require.Equal(t, http.StatusUnauthorized, signIn(t, browser, s.url, "admin", wrongPassword))
	require.Equal(t, http.StatusSeeOther, signIn(t, browser, s.url, "admin", adminPassword))
	u, _ := url.Parse(s.url)
	for _, c := range jar.Cookies(u) {
		secrets["cookie "+c.Name] = c.Value
	}
	resp, err := browser.Get(s.url + "/keys")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "signed in")

	// Stop the server so its log is complete.
	require.NoError(t, s.Signal(syscall.SIGTERM))
	done := make(chan error, 1)
	go func() { done <- s.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("the server did not stop")
	}
	log := s.Log.String()

	// The bootstrap secrets: exactly once each, in the line announcing them.
	for name, sec := range map[string]string{"api_key": apiKey, "password": adminPassword} {
		require.Equal(t, 1, strings.Count(log, sec), "the generated %s is logged exactly once", name)
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, sec) {
				require.Contains(t, line, "shown only once", "the generated %s appears only in its announcement", name)
			}
		}
	}
	for name, sec := range secrets {
		require.NotEmpty(t, sec, name)
		require.NotContains(t, log, sec, "the %s appears in the server log", name)
	}
	require.Greater(t, len(logRecords(t, log)), 5, "the run was logged")
}

// postAs is post with another API key.
func postAs(t *testing.T, key, url string, body any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return resp.StatusCode, m
}

var csrfInput = regexp.MustCompile(`name="_csrf" value="([^"]+)"`)

// signIn posts the sign-in form with the CSRF token of a fresh form and returns the status.
func signIn(t *testing.T, c *http.Client, base, username, password string) int {
	t.Helper()
	resp, err := c.Get(base + "/login")
	require.NoError(t, err)
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := csrfInput.FindSubmatch(page)
	require.NotNil(t, m, "sign-in form has a CSRF field: %s", page)
	form := url.Values{"username": {username}, "password": {password}, "_csrf": {string(m[1])}}
	resp, err = c.PostForm(base+"/login", form)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// logRecords parses the JSON lines of a log; lines that are not JSON fail the test.
func logRecords(t *testing.T, log string) []map[string]any {
	t.Helper()
	var recs []map[string]any
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "log line is not JSON: %s", line)
		recs = append(recs, rec)
	}
	return recs
}
