// Package forward holds what idemgate's two forwarders (web/proxy, `idemgate proxy`, and
// web/mcpgateway, `idemgate mcp-gateway`) must judge the same way about a request they pass
// to an upstream: whether a failed request can have reached it, which headers belong to one
// connection only, and how a streamed answer ends its request.
package forward

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"

	"github.com/gofiber/fiber/v2"
)

// NotSent reports whether err, from sending a request, means the request cannot have reached
// the upstream: the connection was refused or could not be made in time. Anything else (a
// reset, a timeout waiting for the answer, a connection closed before the first byte) may
// come after the upstream read the request, so its effect is unknown.
func NotSent(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	// A TLS handshake that failed (a certificate not trusted, a server that answered in
	// plain HTTP) sent no request: the request is written only after the handshake.
	var verify *tls.CertificateVerificationError
	var header tls.RecordHeaderError
	var unknownAuthority x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	return errors.As(err, &verify) || errors.As(err, &header) || errors.As(err, &unknownAuthority) ||
		errors.As(err, &hostname) || errors.As(err, &invalid) ||
		// net/http turns a RecordHeaderError into this text, with no type to match.
		strings.Contains(err.Error(), "server gave HTTP response to HTTPS client")
}

// HopByHop reports the headers of one connection (RFC 9110 §7.6.1), never forwarded.
func HopByHop(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization", "Te",
		"Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// CloseCancels is a streamed answer's body: fasthttp closes it once it has sent the answer (or
// the client went away), which ends the upstream request's context through Cancel.
type CloseCancels struct {
	io.ReadCloser
	Cancel context.CancelFunc
}

// Close closes the body, then cancels the request's context.
func (b *CloseCancels) Close() error {
	err := b.ReadCloser.Close()
	b.Cancel()
	return err
}

// CopyResponseHeaders puts resp's status and headers on c, but for hop-by-hop ones and the
// length, which the body that follows sets; an answer without a Content-Type gets none
// (fasthttp would add its default).
func CopyResponseHeaders(c *fiber.Ctx, resp *http.Response) {
	c.Status(resp.StatusCode)
	for name, vs := range resp.Header {
		if HopByHop(name) || name == "Content-Length" {
			continue
		}
		for _, v := range vs {
			c.Response().Header.Add(name, v)
		}
	}
	if resp.Header.Get("Content-Type") == "" {
		c.Response().Header.SetNoDefaultContentType(true)
	}
}

// StreamBody sends resp's body to the client as it comes, ending the upstream request's
// context (cancel) once it has been sent. An answer that has no body (to a HEAD, or a 1xx, 204
// or 304) is not streamed: fasthttp would try to send the declared length from an empty body,
// fail, and close the connection under a client that may already be reusing it.
func StreamBody(c *fiber.Ctx, resp *http.Response, cancel context.CancelFunc) {
	if c.Method() == fiber.MethodHead || resp.StatusCode < 200 || resp.StatusCode == http.StatusNoContent ||
		resp.StatusCode == http.StatusNotModified {
		resp.Body.Close()
		cancel()
		if c.Method() == fiber.MethodHead && resp.ContentLength > 0 {
			c.Response().Header.SetContentLength(int(resp.ContentLength))
		}
		c.Response().SkipBody = true
		return
	}
	c.Response().SetBodyStream(&CloseCancels{ReadCloser: resp.Body, Cancel: cancel}, int(resp.ContentLength))
}

// CallerScope is the part of a key's scope that keeps two callers' equal keys apart (the
// proxy's and the gateway's --caller-header): " caller=" and the first 16 hex digits of the
// SHA-256 of value, the caller's header, or "" when it is empty (the anonymous caller).
func CallerScope(value string) string {
	if value == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(value))
	return " caller=" + hex.EncodeToString(sum[:8])
}

// ParseUpstream reads a forwarder's --upstream: an absolute http:// or https:// URL with a
// host. Errors say which of those it is not.
func ParseUpstream(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("upstream %q: want an absolute http:// or https:// URL", raw)
	}
	return u, nil
}
