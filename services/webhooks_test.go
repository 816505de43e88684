package services

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgate/idemgate/models"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

func TestValidateWebhookURL(t *testing.T) {
	ok := []string{
		"https://hooks.example.com/idemgate", "https://example.com", "https://example.com:8443/x?y=1",
		"http://127.0.0.1:9000/hook", "http://localhost/hook", "http://[::1]:8080/", "http://127.1.2.3/",
		"https://[2001:db8::1]/h",
	}
	for _, u := range ok {
		require.Empty(t, ValidateWebhookURL(u, false), u)
	}
	bad := []string{
		"", "http://example.com/hook", "http://10.0.0.1/", "ftp://example.com/", "hooks.example.com/x",
		"https://user:pw@example.com/", "https://example.com/#frag", "https:///path", "https://exa mple.com/",
		"https://example.com:99999/", "https://example.com:/", "javascript:alert(1)", "http://localhost.evil.com/",
		"https://example.com/\x00", "http://0.0.0.0/", "//example.com/x", "https://" + strings.Repeat("a", 2100) + ".com/",
		// Issue 28: the metadata service, loopback in another spelling, link-local with a
		// zone, unspecified, private, multicast.
		"https://169.254.169.254/latest/meta-data/", "http://[::ffff:127.0.0.1]:8080/", "https://[::ffff:7f00:1]/",
		"https://[fe80::1%25eth0]/", "https://[::]/", "https://0.0.0.0/", "https://10.1.2.3/", "https://192.168.1.1/",
		"https://172.16.0.1/", "https://100.64.0.1/", "https://[fd00::1]/", "https://224.0.0.1/",
		// Found by trying odd spellings: numeric IPv4 that resolvers accept, a trailing dot,
		// fullwidth digits, names of this machine, IPv4 carried in IPv6 (SIIT, compatible,
		// NAT64, 6to4), 0.0.0.0/8, reserved and broadcast, benchmarking, site-local.
		"https://2130706433/", "https://0x7f.1/", "https://0177.0.0.1/", "https://017700000001/", "https://0/",
		"https://169.254.169.254./", "https://127.0.0.1./", "https://\uff10x7f.1/", "https://localhost./",
		"https://foo.localhost/", "https://[::169.254.169.254]/", "https://[64:ff9b::169.254.169.254]/",
		"https://[2002:a9fe:a9fe::]/", "https://[::ffff:0:169.254.169.254]/", "https://[::ffff:0:7f00:1]/",
		"https://0.1.2.3/", "https://255.255.255.255/", "https://240.0.0.1/", "https://198.18.0.1/", "https://[fec0::1]/",
	}
	for _, u := range bad {
		msg := ValidateWebhookURL(u, false)
		require.NotEmpty(t, msg, u)
		require.NotContains(t, msg, "that a", "the message reads as a sentence: %s", msg)
	}
	// Public addresses, and IPv6 forms that carry a public IPv4 one, stay allowed.
	for _, u := range []string{"https://93.184.215.14/", "https://[64:ff9b::5db8:d70e]/", "https://[2002:5db8:d70e::1]/", "https://example.com./"} {
		require.Empty(t, ValidateWebhookURL(u, false), u)
	}
}

// TestWebhookPrivateReceiversAllowedBySwitch: IDEMGATE_WEBHOOK_ALLOW_PRIVATE admits private
// addresses and nothing else: link-local (metadata), unspecified and loopback in another
// spelling stay refused.
func TestWebhookPrivateReceiversAllowedBySwitch(t *testing.T) {
	for _, u := range []string{"https://10.1.2.3/", "https://192.168.1.1/h", "https://[fd00::1]/", "https://100.64.0.1/"} {
		require.NotEmpty(t, ValidateWebhookURL(u, false), u)
		require.Empty(t, ValidateWebhookURL(u, true), u)
	}
	for _, u := range []string{"https://169.254.169.254/", "http://[::ffff:127.0.0.1]/", "https://[fe80::1%25eth0]/", "https://0.0.0.0/"} {
		require.NotEmpty(t, ValidateWebhookURL(u, true), u)
	}
}

// TestWebhookDialChecksEveryAddress: the dispatcher's dialer applies the rule to the address it
// connects to, after DNS: localhost and 127.0.0.1 reach a receiver on this machine,
// ::ffff:127.0.0.1 (the same socket) is refused before any byte is sent.
func TestWebhookDialChecksEveryAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	dial := webhookDialContext(time.Second, false)
	for _, host := range []string{"127.0.0.1", "localhost"} {
		c, err := dial(bg, "tcp4", net.JoinHostPort(host, port))
		require.NoError(t, err, host)
		_ = c.Close()
	}
	_, err = dial(bg, "tcp", net.JoinHostPort("::ffff:127.0.0.1", port))
	require.ErrorContains(t, err, "loopback")
	_, err = webhookDialContext(time.Second, true)(bg, "tcp", "169.254.169.254:80")
	require.ErrorContains(t, err, "link-local")
}

func TestParseWebhookEvents(t *testing.T) {
	got, msg := ParseWebhookEvents(" operation.possible_duplicate_effect,operation.uncertain, operation.uncertain ")
	require.Empty(t, msg)
	require.Equal(t, []string{EventOperationUncertain, EventPossibleDuplicateEffect}, got)
	for _, bad := range []string{"", " , ", "operation.unknown", "operation.uncertain,Operation.Reconciled"} {
		_, msg := ParseWebhookEvents(bad)
		require.NotEmpty(t, msg, bad)
	}
}

// FuzzValidateWebhookURL: whatever the input, the validator answers without panicking, and an
// accepted URL is https, or http to a loopback host.
func FuzzValidateWebhookURL(f *testing.F) {
	for _, s := range []string{"https://example.com/x", "http://127.0.0.1:1/", "http://[::1]/", "http://a/", "https://u@h/",
		"https://169.254.169.254/", "http://[::ffff:127.0.0.1]:1/", "https://[fe80::1%25eth0]/", "https://10.0.0.1/",
		"httP://127.0.0.10", "HTTP://10.0.0.1/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, u string) {
		if ValidateWebhookURL(u, false) != "" {
			return
		}
		// Schemes compare case-insensitively (RFC 3986 §3.1; url.Parse lowers them, and so does
		// every HTTP client): "httP://127.0.0.10" is http to a loopback host.
		lower := strings.ToLower(u)
		if !strings.HasPrefix(lower, "https://") && !strings.HasPrefix(lower, "http://") {
			t.Fatalf("accepted %q without an http(s) scheme", u)
		}
		// An accepted IP literal is one the dispatcher may connect to.
		p, err := url.Parse(u)
		if err != nil {
			t.Fatalf("accepted %q that does not parse: %v", u, err)
		}
		if ip, err := netip.ParseAddr(p.Hostname()); err == nil && webhookAddrRefusal(p.Hostname(), ip, false) != "" {
			t.Fatalf("accepted %q, an address the dispatcher refuses", u)
		}
	})
}

// FuzzParseWebhookEvents: an accepted list is non-empty, canonical and made of known types.
func FuzzParseWebhookEvents(f *testing.F) {
	f.Add("operation.uncertain,operation.reconciled")
	f.Add(",,operation.possible_duplicate_effect")
	f.Add("x")
	f.Fuzz(func(t *testing.T, s string) {
		got, msg := ParseWebhookEvents(s)
		if msg != "" {
			return
		}
		require.NotEmpty(t, got)
		j := 0
		for _, e := range got {
			for j < len(WebhookEventTypes) && WebhookEventTypes[j] != e {
				j++
			}
			require.Less(t, j, len(WebhookEventTypes), "unknown or out of order: %v", got)
			j++
		}
	})
}

// newEndpoint creates an endpoint of b's tenant for url and events.
func newEndpoint(t *testing.T, b *testBundle, url, events string) *CreatedWebhookEndpoint {
	t.Helper()
	name, err := b.dash.TenantName(bg, b.p.TenantID)
	require.NoError(t, err)
	ep, err := NewWebhooks(b.db, b.auth.log, false).CreateEndpoint(bg, "tester", WebhookEndpointInput{Tenant: name, URL: url, Events: events})
	require.NoError(t, err)
	return ep
}

// outbox returns the events of endpoint id, oldest first.
func outbox(t *testing.T, b *testBundle, id int64) []models.WebhookEvent {
	t.Helper()
	var evs []models.WebhookEvent
	require.NoError(t, b.db.Where("endpoint_id = ?", id).Order("id").Find(&evs).Error)
	return evs
}

func TestWebhookEndpointsManage(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		wh := NewWebhooks(b.db, b.auth.log, false)
		name, err := b.dash.TenantName(bg, b.p.TenantID)
		require.NoError(t, err)
		_, err = wh.CreateEndpoint(bg, "tester", WebhookEndpointInput{Tenant: name + " ", URL: "https://e.example/x", Events: EventOperationUncertain})
		require.True(t, isCode(err, CodeInvalidRequest), "a typo of a tenant must not create one: %v", err)
		_, err = wh.CreateEndpoint(bg, "tester", WebhookEndpointInput{Tenant: name, URL: "http://example.com/", Events: ""})
		var de *Error
		require.ErrorAs(t, err, &de)
		require.Len(t, de.Fields, 2)

		ep := newEndpoint(t, b, "https://e.example/x", "operation.reconciled,operation.uncertain")
		require.True(t, strings.HasPrefix(ep.Secret, "whsec_"))
		raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(ep.Secret, "whsec_"))
		require.NoError(t, err)
		require.Len(t, raw, 32)
		list, err := wh.ListEndpoints(bg, name)
		require.NoError(t, err)
		require.Len(t, list, 1)
		require.Equal(t, []string{EventOperationUncertain, EventOperationReconciled}, list[0].Events)
		require.Equal(t, "active", list[0].Status)
		js, _ := json.Marshal(list)
		require.NotContains(t, string(js), ep.Secret, "a list never carries the secret")

		require.NoError(t, wh.SetEndpointDisabled(bg, "tester", ep.Endpoint.ID, true))
		list, _ = wh.ListEndpoints(bg, name)
		require.Equal(t, "disabled", list[0].Status)
		require.NoError(t, wh.DeleteEndpoint(bg, "tester", ep.Endpoint.ID))
		require.ErrorIs(t, wh.DeleteEndpoint(bg, "tester", ep.Endpoint.ID), ErrNotFound)
		list, _ = wh.ListEndpoints(bg, name)
		require.Empty(t, list)
		var row models.WebhookEndpoint
		require.NoError(t, b.db.Take(&row, ep.Endpoint.ID).Error)
		require.Equal(t, "tester", *row.DeletedBy, "who deleted it is kept")

		_, err = wh.AdminCreateEndpoint(bg, &OperatorAccount{Username: "t", Role: RoleAdmin, TenantID: &b.p.TenantID},
			WebhookEndpointInput{Tenant: name, URL: "https://e.example/", Events: EventOperationUncertain})
		require.True(t, isCode(err, CodeUnauthorized), "only global admins manage endpoints")
	})
}

// TestWebhookOutbox: every path that makes an operation uncertain, reconciles it, or admits a
// possible duplicate effect writes one event per subscribed endpoint of that tenant, in the
// same transaction; unsubscribed endpoints and other tenants get nothing.
func TestWebhookOutbox(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		all := newEndpoint(t, b, "https://all.example/", strings.Join(WebhookEventTypes, ","))
		onlyDup := newEndpoint(t, b, "https://dup.example/", EventPossibleDuplicateEffect)
		other := &testBundle{db: b.db, dash: b.dash, auth: b.auth, p: Principal{TenantID: newTenant(t, b)}}
		otherEp := newEndpoint(t, other, "https://other.example/", strings.Join(WebhookEventTypes, ","))

		// 1. The owner reports uncertain; an operator reconciles it.
		a := mustAcquire(t, b, "wh-owner", 600)
		mustRecord(t, b, a, OutcomeInput{Status: StateUncertain})
		mustRecord(t, b, a, OutcomeInput{Status: StateUncertain}) // the same again: no second event
		_, err := b.recon.ReconcileOutcome(bg, &OperatorAccount{Username: "op", Role: RoleOperator}, a.OperationID,
			ReconcileInput{Status: StateSucceeded, Receipt: ptr("rcpt-1"), Note: "checked the ledger"})
		require.NoError(t, err)

		// 2. A hold expires in_progress and another attempt takes the key over: uncertain,
		// and the new admission is a possible duplicate effect.
		c := mustAcquire(t, b, "wh-takeover", 600)
		expireHold(t, b, "wh-takeover")
		d := mustAcquire(t, b, "wh-takeover", 600)

		// 3. The reaper finds an expired in_progress hold.
		e := mustAcquire(t, b, "wh-reaped", 600)
		expireHold(t, b, "wh-reaped")
		_, err = b.reaper.RunOnce(bg)
		require.NoError(t, err)

		// 4. Admitted again after a confirmed success.
		f := mustAcquire(t, b, "wh-again", 600)
		mustRecord(t, b, f, OutcomeInput{Status: StateSucceeded})
		expireHold(t, b, "wh-again")
		g := mustAcquire(t, b, "wh-again", 600)

		// 5. Admitted again after a clean failure: no event.
		h := mustAcquire(t, b, "wh-failed", 600)
		mustRecord(t, b, h, OutcomeInput{Status: StateFailed, Release: true})
		mustAcquire(t, b, "wh-failed", 600)

		type ev struct{ typ, op, state string }
		var got []ev
		for _, x := range outbox(t, b, all.Endpoint.ID) {
			got = append(got, ev{x.EventType, x.OperationID, x.OpState})
			require.True(t, strings.HasPrefix(x.MsgID, "msg_"), x.MsgID)
			require.Equal(t, DeliveryPending, x.Status)
		}
		require.Equal(t, []ev{
			{EventOperationUncertain, a.OperationID, StateUncertain},
			{EventOperationReconciled, a.OperationID, StateSucceeded},
			{EventOperationUncertain, c.OperationID, StateUncertain},
			{EventPossibleDuplicateEffect, d.OperationID, StateInProgress},
			{EventOperationUncertain, e.OperationID, StateUncertain},
			{EventPossibleDuplicateEffect, g.OperationID, StateInProgress},
		}, got)
		dups := outbox(t, b, onlyDup.Endpoint.ID)
		require.Len(t, dups, 2)
		require.Equal(t, c.OperationID, *dups[0].PreviousOperationID)
		require.Equal(t, StateUncertain, *dups[0].PreviousState)
		require.Equal(t, StateSucceeded, *dups[1].PreviousState)
		require.Empty(t, outbox(t, b, otherEp.Endpoint.ID), "another tenant's endpoint gets nothing")
		ids := map[string]bool{}
		for _, x := range append(outbox(t, b, all.Endpoint.ID), dups...) {
			require.False(t, ids[x.MsgID], "msg ids are unique")
			ids[x.MsgID] = true
		}
	})
}

// newTenant creates another tenant in b's database and returns its id.
func newTenant(t *testing.T, b *testBundle) int64 {
	t.Helper()
	tn := models.Tenant{Name: "wh-" + randomHex(4), CreatedAt: time.Now().UTC()}
	require.NoError(t, b.db.Create(&tn).Error)
	return tn.ID
}

// expireHold moves the hold of key in b's tenant into the past.
func expireHold(t *testing.T, b *testBundle, key string) {
	t.Helper()
	past := time.Now().UTC().Add(-time.Hour)
	require.NoError(t, b.db.Model(&models.IdemKey{}).Where("tenant_id = ? AND key = ?", b.p.TenantID, key).
		Update("expires_at", past).Error)
	require.NoError(t, b.db.Model(&models.Operation{}).Where("tenant_id = ? AND key = ? AND state = ?", b.p.TenantID, key, StateInProgress).
		Update("expires_at", past).Error)
}

// receiver is a webhook receiver on loopback that checks every signature with its own HMAC
// code (not the library the dispatcher signs with) and answers from answer.
type receiver struct {
	t      *testing.T
	secret []byte
	answer func(n int) int // n-th request (from 1) -> status
	mu     sync.Mutex
	got    []received
	srv    *httptest.Server
}

type received struct {
	id, ts string
	body   []byte
}

func newReceiver(t *testing.T, answer func(n int) int) *receiver {
	r := &receiver{t: t, answer: answer}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) setSecret(whsec string) {
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(whsec, "whsec_"))
	require.NoError(r.t, err)
	r.secret = raw
}

// verify checks a Standard Webhooks signature by hand: v1,<base64 HMAC-SHA256(id.ts.body)>.
func verify(secret []byte, id, ts string, body []byte, header string) bool {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, s := range strings.Fields(header) {
		if hmac.Equal([]byte(s), []byte(want)) {
			return true
		}
	}
	return false
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	id, ts := req.Header.Get("webhook-id"), req.Header.Get("webhook-timestamp")
	if !verify(r.secret, id, ts, body, req.Header.Get("webhook-signature")) {
		r.t.Errorf("bad signature on %s", id)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || time.Since(time.Unix(sec, 0)).Abs() > time.Minute {
		r.t.Errorf("webhook-timestamp %q is not now in unix seconds", ts)
	}
	r.mu.Lock()
	r.got = append(r.got, received{id, ts, body})
	n := len(r.got)
	r.mu.Unlock()
	w.WriteHeader(r.answer(n))
	_, _ = w.Write([]byte("answer " + strconv.Itoa(n)))
}

func (r *receiver) received() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.got...)
}

// fastBackoff retries at once (a millisecond), so tests see every attempt without waiting.
var fastBackoff = []time.Duration{time.Millisecond, time.Millisecond}

// dispatchAll runs d until nothing is due.
func dispatchAll(t *testing.T, d *Dispatcher) {
	t.Helper()
	for range 50 {
		n, err := d.RunOnce(bg)
		require.NoError(t, err)
		if n == 0 {
			time.Sleep(5 * time.Millisecond) // backoff of a millisecond: due again at once
			if n, err = d.RunOnce(bg); err == nil && n == 0 {
				return
			}
			require.NoError(t, err)
		}
	}
}

// TestWebhookDelivery: a delivery is signed (checked by hand), retried with the same
// webhook-id and body after a failure, and recorded: attempts, last status, last error.
func TestWebhookDelivery(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		rc := newReceiver(t, func(n int) int {
			if n == 1 {
				return http.StatusInternalServerError
			}
			return http.StatusNoContent
		})
		ep := newEndpoint(t, b, rc.srv.URL+"/hook", EventOperationUncertain)
		rc.setSecret(ep.Secret)
		a := mustAcquire(t, b, "wh-deliver", 600)
		mustRecord(t, b, a, OutcomeInput{Status: StateUncertain})

		d := NewDispatcher(b.db, b.auth.log, DispatcherConfig{Timeout: 5 * time.Second, Backoff: fastBackoff, Instance: "t1"})
		dispatchAll(t, d)
		got := rc.received()
		require.Len(t, got, 2)
		require.Equal(t, got[0].id, got[1].id, "a retry keeps its webhook-id")
		require.Equal(t, got[0].body, got[1].body, "and its body")
		var p map[string]any
		require.NoError(t, json.Unmarshal(got[0].body, &p))
		require.Equal(t, EventOperationUncertain, p["type"])
		_, err := time.Parse(time.RFC3339Nano, p["timestamp"].(string))
		require.NoError(t, err)
		op := p["data"].(map[string]any)["operation"].(map[string]any)
		require.Equal(t, a.OperationID, op["id"])
		require.Equal(t, "wh-deliver", op["key"])
		require.Equal(t, StateUncertain, op["state"])

		evs := outbox(t, b, ep.Endpoint.ID)
		require.Len(t, evs, 1)
		require.Equal(t, DeliveryDelivered, evs[0].Status)
		require.Equal(t, 2, evs[0].Attempts)
		require.Equal(t, http.StatusNoContent, *evs[0].LastStatus)
		require.Nil(t, evs[0].ClaimedBy)
		require.NotNil(t, evs[0].DeliveredAt)

		dl, err := NewWebhooks(b.db, b.auth.log, false).Deliveries(bg, &OperatorAccount{Role: RoleAuditor, TenantID: &b.p.TenantID}, "", 10)
		require.NoError(t, err)
		require.Len(t, dl, 1)
		require.Equal(t, a.OperationID, dl[0].OperationID)
		other := int64(-1)
		dl, err = NewWebhooks(b.db, b.auth.log, false).Deliveries(bg, &OperatorAccount{Role: RoleAuditor, TenantID: &other}, "", 10)
		require.NoError(t, err)
		require.Empty(t, dl, "a restricted account sees only its tenant's deliveries")
		mine := &OperatorAccount{Role: RoleAuditor, TenantID: &b.p.TenantID}
		dl, err = NewWebhooks(b.db, b.auth.log, false).Deliveries(bg, mine, DeliveryFailed, 10)
		require.NoError(t, err)
		require.Empty(t, dl, "filtered by status")
		dl, err = NewWebhooks(b.db, b.auth.log, false).Deliveries(bg, mine, DeliveryDelivered, 10)
		require.NoError(t, err)
		require.Len(t, dl, 1)
		_, err = NewWebhooks(b.db, b.auth.log, false).Deliveries(bg, mine, "lost", 10)
		require.True(t, isCode(err, CodeInvalidRequest))
	})
}

// TestWebhookDeliveryGivesUp: after the last attempt a delivery is failed, with the last
// status and error kept; a redirect is never followed.
func TestWebhookDeliveryGivesUp(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		var followed sync.Mutex
		target := false
		dst := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			followed.Lock()
			target = true
			followed.Unlock()
		}))
		defer dst.Close()
		rc := newReceiver(t, func(int) int { return http.StatusFound })
		rc.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			rc.serve(&redirectWriter{ResponseWriter: w, to: dst.URL}, req)
		})
		ep := newEndpoint(t, b, rc.srv.URL, EventOperationUncertain)
		rc.setSecret(ep.Secret)
		a := mustAcquire(t, b, "wh-giveup", 600)
		mustRecord(t, b, a, OutcomeInput{Status: StateUncertain})
		dispatchAll(t, NewDispatcher(b.db, b.auth.log, DispatcherConfig{Backoff: fastBackoff}))
		require.Len(t, rc.received(), len(fastBackoff)+1)
		evs := outbox(t, b, ep.Endpoint.ID)
		require.Equal(t, DeliveryFailed, evs[0].Status)
		require.Equal(t, len(fastBackoff)+1, evs[0].Attempts)
		require.Equal(t, http.StatusFound, *evs[0].LastStatus)
		require.Contains(t, *evs[0].LastError, "redirects are not followed")
		followed.Lock()
		require.False(t, target, "the redirect target was never called")
		followed.Unlock()
	})
}

type redirectWriter struct {
	http.ResponseWriter
	to string
}

func (w *redirectWriter) WriteHeader(code int) {
	w.Header().Set("Location", w.to)
	w.ResponseWriter.WriteHeader(code)
}

// TestWebhookDisabledAndDeleted: a disabled endpoint's deliveries wait; deleting it fails them.
func TestWebhookDisabledAndDeleted(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		rc := newReceiver(t, func(int) int { return http.StatusOK })
		ep := newEndpoint(t, b, rc.srv.URL, EventOperationUncertain)
		rc.setSecret(ep.Secret)
		wh := NewWebhooks(b.db, b.auth.log, false)
		a := mustAcquire(t, b, "wh-paused", 600)
		mustRecord(t, b, a, OutcomeInput{Status: StateUncertain})
		require.NoError(t, wh.SetEndpointDisabled(bg, "tester", ep.Endpoint.ID, true))
		d := NewDispatcher(b.db, b.auth.log, DispatcherConfig{})
		n, err := d.RunOnce(bg)
		require.NoError(t, err)
		require.Zero(t, n, "a disabled endpoint's delivery waits")
		require.NoError(t, wh.DeleteEndpoint(bg, "tester", ep.Endpoint.ID))
		evs := outbox(t, b, ep.Endpoint.ID)
		require.Equal(t, DeliveryFailed, evs[0].Status)
		require.Contains(t, *evs[0].LastError, "endpoint deleted")
		require.Empty(t, rc.received())
	})
}

// TestWebhookTwoDispatchersDeliverOnce: two dispatchers (two instances) on one PostgreSQL
// database deliver many events concurrently; each is delivered exactly once.
func TestWebhookTwoDispatchersDeliverOnce(t *testing.T) {
	onPostgres(t, func(t *testing.T, b *testBundle) {
		rc := newReceiver(t, func(int) int { return http.StatusOK })
		ep := newEndpoint(t, b, rc.srv.URL, EventOperationUncertain)
		rc.setSecret(ep.Secret)
		const n = 150
		for i := range n {
			a := mustAcquire(t, b, "wh-many-"+strconv.Itoa(i), 600)
			mustRecord(t, b, a, OutcomeInput{Status: StateUncertain})
		}
		ctx, cancel := context.WithCancel(bg)
		defer cancel()
		var wg sync.WaitGroup
		for _, name := range []string{"one", "two"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d := NewDispatcher(b.db, b.auth.log, DispatcherConfig{Instance: name, Poll: 10 * time.Millisecond})
				d.Run(ctx)
			}()
		}
		require.Eventually(t, func() bool {
			var pending int64
			require.NoError(t, b.db.Model(&models.WebhookEvent{}).Where("endpoint_id = ? AND status <> ?", ep.Endpoint.ID, DeliveryDelivered).
				Count(&pending).Error)
			return pending == 0
		}, 60*time.Second, 20*time.Millisecond)
		cancel()
		wg.Wait()
		seen := map[string]int{}
		for _, r := range rc.received() {
			seen[r.id]++
		}
		require.Len(t, seen, n)
		for id, c := range seen {
			require.Equal(t, 1, c, "%s delivered %d times", id, c)
		}
		var claimedBy []string
		require.NoError(t, b.db.Model(&models.WebhookEvent{}).Where("endpoint_id = ?", ep.Endpoint.ID).
			Distinct().Pluck("attempts", &claimedBy).Error)
		require.Equal(t, []string{"1"}, claimedBy, "every event took exactly one attempt")
	})
}

// TestWebhookEventsPurgedWithOperation: when retention purges an operation, its finished
// deliveries go with it; a pending one is kept (still owed to its receiver).
func TestWebhookEventsPurgedWithOperation(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		ep := newEndpoint(t, b, "https://purge.example/", EventOperationUncertain+","+EventOperationReconciled)
		a := mustAcquire(t, b, "wh-purge", 600)
		mustRecord(t, b, a, OutcomeInput{Status: StateUncertain})
		mustRecord(t, b, a, OutcomeInput{Status: StateFailed, Release: true})
		evs := outbox(t, b, ep.Endpoint.ID)
		require.Len(t, evs, 2)
		require.NoError(t, b.db.Model(&models.WebhookEvent{}).Where("id = ?", evs[0].ID).Update("status", DeliveryDelivered).Error)
		short := NewReaper(b.db, b.auth.log, time.Millisecond)
		time.Sleep(20 * time.Millisecond)
		_, err := short.RunOnce(bg)
		require.NoError(t, err)
		_, err = b.reads.GetOperation(bg, b.p.TenantID, a.OperationID)
		require.ErrorIs(t, err, ErrNotFound)
		left := outbox(t, b, ep.Endpoint.ID)
		require.Len(t, left, 1)
		require.Equal(t, evs[1].MsgID, left[0].MsgID, "the pending delivery is kept")
	})
}

// TestWebhookOutboxIsTransactional: the event is written by the state change's own
// transaction: visible inside it, gone when it rolls back.
func TestWebhookOutboxIsTransactional(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		ep := newEndpoint(t, b, "https://tx.example/", EventOperationUncertain)
		a := mustAcquire(t, b, "wh-rollback", 600)
		errRollback := errors.New("roll back")
		err := b.db.Tx(bg, func(tx *gorm.DB) error {
			require.NoError(t, tx.Model(&models.Operation{}).Where("id = ?", a.OperationID).Update("state", StateUncertain).Error)
			var n int64
			require.NoError(t, tx.Model(&models.WebhookEvent{}).Where("endpoint_id = ?", ep.Endpoint.ID).Count(&n).Error)
			require.EqualValues(t, 1, n, "written in the same transaction")
			return errRollback
		})
		require.ErrorIs(t, err, errRollback)
		require.Empty(t, outbox(t, b, ep.Endpoint.ID), "no event without its state change")
	})
}

// TestWebhookOutboxBatchAndGroupedPaths: the PL/pgSQL batch function and group admission
// (PostgreSQL's acquire paths that run inside the database) write the same events: a takeover
// of an expired in_progress hold is an uncertain event and a possible duplicate effect.
func TestWebhookOutboxBatchAndGroupedPaths(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		ep := newEndpoint(t, b, "https://batch.example/", EventOperationUncertain+","+EventPossibleDuplicateEffect)
		for _, key := range []string{"wh-batch", "wh-group"} {
			mustAcquire(t, b, key, 600)
			expireHold(t, b, key)
		}
		items, err := b.adm.AcquireBatch(bg, b.p, []AcquireInput{{Key: "wh-batch", TTLSeconds: 60}, {Key: "wh-batch-new", TTLSeconds: 60}})
		require.NoError(t, err)
		require.Len(t, items, 2)
		g, err := b.adm.WithGroupAdmission(true).Acquire(bg, b.p, AcquireInput{Key: "wh-group", TTLSeconds: 60})
		require.NoError(t, err)
		require.True(t, g.Admitted)
		var types []string
		for _, e := range outbox(t, b, ep.Endpoint.ID) {
			types = append(types, e.OpKey+" "+e.EventType)
		}
		require.Equal(t, []string{
			"wh-batch " + EventOperationUncertain, "wh-batch " + EventPossibleDuplicateEffect,
			"wh-group " + EventOperationUncertain, "wh-group " + EventPossibleDuplicateEffect,
		}, types)
	})
}

// TestWebhookDispatcherStopsMidDelivery: cancelling Run (shutdown) cuts off a hanging delivery
// at once and records nothing: the row stays claimed until its lease lapses, then is due again.
func TestWebhookDispatcherStopsMidDelivery(t *testing.T) {
	eachDB(t, func(t *testing.T, b *testBundle) {
		arrived := make(chan struct{}, 1)
		rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.ReadAll(r.Body) // the server notices a closed connection only once the body is read
			arrived <- struct{}{}
			<-r.Context().Done()
		}))
		defer rc.Close()
		ep := newEndpoint(t, b, rc.URL, EventOperationUncertain)
		a := mustAcquire(t, b, "wh-stop", 600)
		mustRecord(t, b, a, OutcomeInput{Status: StateUncertain})
		ctx, cancel := context.WithCancel(bg)
		done := make(chan struct{})
		go func() {
			defer close(done)
			NewDispatcher(b.db, b.auth.log, DispatcherConfig{Poll: 10 * time.Millisecond, Timeout: 5 * time.Second}).Run(ctx)
		}()
		select {
		case <-arrived:
		case <-time.After(10 * time.Second):
			t.Fatal("no delivery")
		}
		cancel()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			t.Fatal("Run did not stop with its context")
		}
		evs := outbox(t, b, ep.Endpoint.ID)
		require.Equal(t, DeliveryPending, evs[0].Status)
		require.Zero(t, evs[0].Attempts, "nothing recorded for the cut-off attempt")
		require.NotNil(t, evs[0].ClaimedBy)
		require.True(t, evs[0].NextAttemptAt.After(time.Now().Add(10*time.Second)), "due again when the 15 s lease lapses")
	})
}
