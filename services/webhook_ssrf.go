package services

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"time"

	"golang.org/x/text/width"
)

// Webhook receivers are URLs an admin types, and the dispatcher POSTs to them from inside the
// deployment's network: without a rule an endpoint could name the cloud metadata service
// (169.254.169.254), the database (127.0.0.1:5432 over an odd spelling) or any private host,
// and /webhooks would show the first 200 bytes of whatever answered (issue 28). The rule is
// applied twice: to an IP written in the URL when the endpoint is created, and to every
// address the dispatcher connects to, after DNS, since a name may resolve elsewhere later.

// webhookAddrRefusal returns "" if the dispatcher may connect to ip for a URL whose host is
// host, else why not, as a noun phrase ("a private address …"):
//   - unspecified (0.0.0.0/8, ::), multicast, reserved (240.0.0.0/4 with the broadcast
//     address) and link-local addresses (169.254.0.0/16 with the metadata services,
//     fe80::/10) are always refused;
//   - loopback only when the URL wrote it in a documented form, 127.0.0.0/8 in dotted IPv4,
//     ::1 or localhost (receivers on the same machine, docs/reference.md §10); never through
//     another spelling (::ffff:127.0.0.1) or a name that resolves to it;
//   - private addresses (10/8, 172.16/12, 192.168/16, 100.64/10, 198.18/15, fc00::/7,
//     fec0::/10) only when allowPrivate (IDEMGATE_WEBHOOK_ALLOW_PRIVATE).
//
// An IPv6 address that carries an IPv4 one (mapped ::ffff:0:0/96, SIIT ::ffff:0:0:0/96,
// compatible ::/96, NAT64 64:ff9b::/96, 6to4 2002::/16) is judged as the IPv4 address it
// carries: on a network that translates it, that is where the connection goes.
func webhookAddrRefusal(host string, ip netip.Addr, allowPrivate bool) string {
	if v4, ok := embeddedIPv4(ip); ok {
		ip = v4
	}
	switch {
	case !ip.IsValid() || ip.IsUnspecified() || thisNetwork.Contains(ip):
		return "an unspecified address"
	case ip.IsMulticast() || ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast():
		return "a multicast address"
	case reserved.Contains(ip):
		return "a reserved or broadcast address"
	case ip.IsLinkLocalUnicast():
		return "a link-local address (where cloud metadata services answer)"
	case ip.IsLoopback():
		if isDocumentedLoopback(host) {
			return ""
		}
		return "a loopback address not written as 127.0.0.1, ::1 or localhost"
	case ip.IsPrivate() || cgnat.Contains(ip) || benchmarking.Contains(ip) || siteLocal.Contains(ip):
		if allowPrivate {
			return ""
		}
		return "a private address (set IDEMGATE_WEBHOOK_ALLOW_PRIVATE=true to allow private receivers)"
	}
	return ""
}

// Address blocks netip has no predicate for: 0.0.0.0/8 "this network" (RFC 1122), 240.0.0.0/4
// reserved with 255.255.255.255 (RFC 1112, RFC 919), 100.64.0.0/10 shared address space (RFC
// 6598), 198.18.0.0/15 benchmarking (RFC 2544), fec0::/10 the deprecated IPv6 site-local.
var (
	thisNetwork  = netip.MustParsePrefix("0.0.0.0/8")
	reserved     = netip.MustParsePrefix("240.0.0.0/4")
	cgnat        = netip.MustParsePrefix("100.64.0.0/10")
	benchmarking = netip.MustParsePrefix("198.18.0.0/15")
	siteLocal    = netip.MustParsePrefix("fec0::/10")
	nat64        = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour    = netip.MustParsePrefix("2002::/16")
)

// embeddedIPv4 returns the IPv4 address an IPv6 address carries, if it is of a form that
// carries one (see webhookAddrRefusal); ::1 and :: are themselves, not IPv4.
func embeddedIPv4(ip netip.Addr) (netip.Addr, bool) {
	if !ip.Is6() {
		return ip, false
	}
	if ip.Is4In6() {
		return ip.Unmap(), true
	}
	b := ip.As16()
	last4 := netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
	zero := func(from, to int) bool {
		for _, x := range b[from:to] {
			if x != 0 {
				return false
			}
		}
		return true
	}
	switch {
	case zero(0, 8) && b[8] == 0xff && b[9] == 0xff && b[10] == 0 && b[11] == 0: // SIIT
		return last4, true
	case zero(0, 12) && !zero(12, 16) && ip != netip.IPv6Loopback(): // IPv4-compatible
		return last4, true
	case nat64.Contains(ip):
		return last4, true
	case sixToFour.Contains(ip):
		return netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}), true
	}
	return ip, false
}

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
// such as fe80::1%eth0 included, a trailing dot ignored), and refuses at creation the
// spellings a resolver may read as an IPv4 address although they are no standard literal
// (2130706433, 0x7f.1, 0177.0.0.1, fullwidth digits: a name's last label is never numeric)
// and names of this machine other than localhost (localhost., *.localhost, RFC 6761). Any
// other name is checked when connecting.
func webhookURLHostRefusal(host string, allowPrivate bool) string {
	trimmed := strings.TrimSuffix(host, ".")
	if ip, err := netip.ParseAddr(trimmed); err == nil {
		return webhookAddrRefusal(host, ip, allowPrivate)
	}
	lower := strings.ToLower(width.Fold.String(trimmed))
	if lower == "localhost" && host != trimmed || strings.HasSuffix(lower, ".localhost") {
		return "a loopback address not written as 127.0.0.1, ::1 or localhost"
	}
	last := lower[strings.LastIndex(lower, ".")+1:]
	if strings.HasPrefix(last, "0x") || (last != "" && strings.Trim(last, "0123456789") == "") {
		return "an IPv4 address in a non-standard spelling (write it as four decimal numbers)"
	}
	return ""
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
				return fmt.Errorf("webhook receiver %s: %s is %s", host, ip, why)
			}
			return nil
		}}
		return d.DialContext(ctx, network, addr)
	}
}
