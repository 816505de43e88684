package services

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"time"
)

// Webhook receivers are URLs an admin types, and the dispatcher POSTs to them from inside the
// deployment's network: without a rule an endpoint could name the cloud metadata service
// (169.254.169.254), the database (127.0.0.1:5432 over an odd spelling) or any private host,
// and /webhooks would show the first 200 bytes of whatever answered (issue 28). The rule is
// applied twice: to an IP written in the URL when the endpoint is created, and to every
// address the dispatcher connects to, after DNS, since a name may resolve elsewhere later.

// webhookAddrRefusal returns "" if the dispatcher may connect to ip for a URL whose host is
// host, else why not:
//   - unspecified, multicast and link-local addresses (169.254.0.0/16 with the metadata
//     services, fe80::/10) are always refused;
//   - loopback only when the URL wrote it in a documented form, 127.0.0.0/8 in dotted IPv4,
//     ::1 or localhost (receivers on the same machine, docs/reference.md §10); never through
//     another spelling (::ffff:127.0.0.1) or a name that resolves to it;
//   - private addresses (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7) only when
//     allowPrivate (IDEMGATE_WEBHOOK_ALLOW_PRIVATE).
//
// IPv4-mapped IPv6 addresses are judged as the IPv4 address they carry.
func webhookAddrRefusal(host string, ip netip.Addr, allowPrivate bool) string {
	ip = ip.Unmap()
	switch {
	case !ip.IsValid() || ip.IsUnspecified():
		return "is an unspecified address"
	case ip.IsMulticast() || ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast():
		return "is a multicast address"
	case ip.IsLinkLocalUnicast():
		return "is a link-local address (where cloud metadata services answer)"
	case ip.IsLoopback():
		if isDocumentedLoopback(host) {
			return ""
		}
		return "reaches this machine (loopback) other than as 127.0.0.1, ::1 or localhost"
	case ip.IsPrivate() || cgnat.Contains(ip):
		if allowPrivate {
			return ""
		}
		return "is a private address (set IDEMGATE_WEBHOOK_ALLOW_PRIVATE=true to allow private receivers)"
	}
	return ""
}

// cgnat is 100.64.0.0/10, shared address space (RFC 6598): private in all but name.
var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// isDocumentedLoopback reports whether host, as written in a URL (no brackets, no port), is
// one of the documented loopback forms: localhost, ::1, or a dotted IPv4 address in 127/8.
func isDocumentedLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") || host == "::1" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Is4() && ip.IsLoopback()
}

// webhookURLHostRefusal applies webhookAddrRefusal to a URL host that is an IP literal (zones
// such as fe80::1%eth0 included); a name is checked only when connecting.
func webhookURLHostRefusal(host string, allowPrivate bool) string {
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return ""
	}
	return webhookAddrRefusal(host, ip, allowPrivate)
}

// webhookDialContext dials like a net.Dialer with timeout, refusing, after DNS, every address
// webhookAddrRefusal refuses for the host of addr (the URL's host and port).
func webhookDialContext(timeout time.Duration, allowPrivate bool) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		d := net.Dialer{Timeout: timeout, Control: func(_, address string, _ syscall.RawConn) error {
			ipText, _, err := net.SplitHostPort(address)
			if err != nil {
				return err
			}
			ip, err := netip.ParseAddr(ipText)
			if err != nil {
				return err
			}
			if why := webhookAddrRefusal(host, ip, allowPrivate); why != "" {
				return fmt.Errorf("webhook receiver %s: %s %s", host, ip, why)
			}
			return nil
		}}
		return d.DialContext(ctx, network, addr)
	}
}
