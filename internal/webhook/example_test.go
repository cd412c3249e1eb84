package webhook_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/kuboprotocol/vertal2kubo/internal/webhook"
)

// The API checks a webhook_url at submit and shows the refusal after the
// field's name.
func ExampleGuard_CheckURL() {
	g := webhook.NewGuard([]netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}, webhook.InterfaceNetworks)
	for _, raw := range []string{
		"https://169.254.169.254/latest/meta-data/",
		"https://[::ffff:127.0.0.1]:8443/hook",
		"http://93.184.216.34/hook",
		"https://user:secret@93.184.216.34/hook",
		"http://10.20.1.2:8080/hook",
	} {
		if _, err := g.CheckURL(context.Background(), raw); err != nil {
			fmt.Println("webhook_url:", err)
			continue
		}
		fmt.Println("accepted", raw)
	}
	// Output:
	// webhook_url: address 169.254.169.254 is refused for webhooks: cloud metadata (169.254.169.254/32)
	// webhook_url: address ::ffff:127.0.0.1 (127.0.0.1) is refused for webhooks: loopback (127.0.0.0/8)
	// webhook_url: must use https: http is allowed only to addresses inside --webhook-allow-cidr, and 93.184.216.34 is not
	// webhook_url: must not contain credentials (user:password@); put a token in the path or query instead
	// accepted http://10.20.1.2:8080/hook
}

func ExampleSign() {
	secret := []byte("whsec_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
	body := []byte(`{"id":"exe_1","status":"succeeded"}`)
	header := webhook.Sign(secret, time.Unix(1700000000, 0), body)
	fmt.Println(header)
	fmt.Println(webhook.Verify(string(secret), header, body, 5*time.Minute, time.Unix(1700000060, 0)))
	fmt.Println(webhook.Verify(string(secret), header, body, 5*time.Minute, time.Unix(1700000600, 0)))
	// Output:
	// t=1700000000,v1=e2d18bb39fc16fa9ebf4026fb613dad5feff7f09e58dc05b3be2a8d65a419f4a
	// <nil>
	// the signature's timestamp 1700000000 is 10m0s old, more than the tolerance of 5m0s
}
