package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/idemgate/idemgate/models/modeltest"
	"github.com/stretchr/testify/require"
)

// hookRequest is one request a test receiver got.
type hookRequest struct {
	id, ts, sig string
	body        []byte
}

// TestWebhookSurvivesKillMidDelivery (issue 12 part 3): a server is killed with SIGKILL while
// its delivery hangs on a real loopback receiver; after a restart the event is delivered again
// with the same webhook-id and body and a valid signature, checked by a hand-written HMAC
// (independent of the library the server signs with), and recorded as delivered.
func TestWebhookSurvivesKillMidDelivery(t *testing.T) {
	url, drop, err := modeltest.CreatePostgres()
	require.NoError(t, err)
	t.Cleanup(drop)

	var mu sync.Mutex
	var got []hookRequest
	firstArrived := make(chan struct{})
	delivered := make(chan struct{}, 8)
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, hookRequest{r.Header.Get("webhook-id"), r.Header.Get("webhook-timestamp"),
			r.Header.Get("webhook-signature"), body})
		n := len(got)
		mu.Unlock()
		if n == 1 {
			close(firstArrived)
			<-r.Context().Done() // hang until the sender dies and its connection closes
			return
		}
		w.WriteHeader(http.StatusOK)
		delivered <- struct{}{}
	}))
	defer rc.Close()

	// A 4 s attempt limit (a 12 s lease): long enough that the kill, right after the request
	// arrives, comes first even on a loaded machine; short enough to keep the test quick.
	dbEnv := []string{"DATABASE_URL=" + url, "IDEMGATE_WEBHOOK_POLL_INTERVAL=100ms", "IDEMGATE_WEBHOOK_TIMEOUT=4s"}
	s1 := startServer(t, dbEnv...)

	cli := exec.Command(binary, "webhook", "create", "--tenant", "default", "--url", rc.URL+"/hook", "--events", "operation.uncertain")
	cli.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "IDEMGATE_LOG_FORMAT=json"}, dbEnv...)
	out, err := cli.Output()
	require.NoError(t, err)
	secret := strings.TrimSpace(string(out))
	require.True(t, strings.HasPrefix(secret, "whsec_"), secret)

	status, acq := post(t, s1.url+"/v1/acquire", map[string]any{"key": "kill-hook", "ttl_seconds": 600})
	require.Equal(t, http.StatusCreated, status, acq)
	opID := acq["operation_id"].(string)
	status, body := post(t, s1.url+"/v1/operations/"+opID+"/outcome", map[string]any{"owner_token": acq["owner_token"], "status": "uncertain"})
	require.Equal(t, http.StatusOK, status, body)

	select {
	case <-firstArrived:
	case <-time.After(30 * time.Second):
		t.Fatalf("no delivery within 30 s; server log:\n%s", s1.Log.String())
	}
	s1.Kill() // SIGKILL, mid-delivery

	db, err := models.Open(context.Background(), models.OpenOptions{DatabaseURL: url})
	require.NoError(t, err)
	defer db.Close()
	var ev models.WebhookEvent
	require.NoError(t, db.Where("operation_id = ?", opID).Take(&ev).Error)
	require.Equal(t, "pending", ev.Status, "the killed delivery was never recorded")
	require.NotNil(t, ev.ClaimedBy, "and is still claimed by the dead process")

	s2 := startServer(t, dbEnv...)
	select {
	case <-delivered:
	case <-time.After(30 * time.Second):
		t.Fatalf("not delivered after the restart; server log:\n%s", s2.Log.String())
	}
	mu.Lock()
	reqs := append([]hookRequest(nil), got...)
	mu.Unlock()
	require.GreaterOrEqual(t, len(reqs), 2)
	require.Equal(t, ev.MsgID, reqs[0].id)
	require.Equal(t, reqs[0].id, reqs[1].id, "the redelivery keeps its webhook-id")
	require.Equal(t, reqs[0].body, reqs[1].body, "and its body")
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	require.NoError(t, err)
	for _, r := range reqs {
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(r.id + "." + r.ts + "." + string(r.body)))
		require.Equal(t, "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)), r.sig, "signature of %s", r.id)
	}
	require.Contains(t, string(reqs[1].body), `"type":"operation.uncertain"`)
	require.Contains(t, string(reqs[1].body), opID)
	require.Eventually(t, func() bool {
		var now models.WebhookEvent
		return db.Where("id = ?", ev.ID).Take(&now).Error == nil && now.Status == "delivered" && now.Attempts == 1
	}, 10*time.Second, 50*time.Millisecond, "recorded as delivered, in one recorded attempt")
}
