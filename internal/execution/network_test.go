package execution

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kuboprotocol/vertal2kubo/internal/config"
)

func TestNetworkFor(t *testing.T) {
	none := config.DefaultPlans()["pro"]
	open := none
	open.Egress = &config.Egress{Allow: []string{"pypi.org", "*.pythonhosted.org", "203.0.113.0/24"}}
	for _, tc := range []struct {
		name  string
		plan  config.Plan
		req   *NetworkRequest
		want  *Network
		error Kind
	}{
		{"no egress, nothing asked", none, nil, nil, 0},
		{"no egress, none asked", none, &NetworkRequest{}, nil, 0},
		{"no egress, some asked", none, &NetworkRequest{Allow: []string{"pypi.org"}}, nil, KindForbidden},
		{"the plan's", open, nil, &Network{Allow: []string{"pypi.org", "*.pythonhosted.org", "203.0.113.0/24"}, MaxBytes: config.DefaultEgressMaxBytes}, 0},
		{"narrowed", open, &NetworkRequest{Allow: []string{"files.pythonhosted.org", "203.0.113.8/29"}},
			&Network{Allow: []string{"files.pythonhosted.org", "203.0.113.8/29"}, MaxBytes: config.DefaultEgressMaxBytes}, 0},
		{"turned off", open, &NetworkRequest{Allow: []string{}}, nil, 0},
		{"widened by name", open, &NetworkRequest{Allow: []string{"evil.example"}}, nil, KindForbidden},
		{"widened by wildcard", open, &NetworkRequest{Allow: []string{"*.example.org"}}, nil, KindForbidden},
		{"widened by prefix", open, &NetworkRequest{Allow: []string{"203.0.0.0/16"}}, nil, KindForbidden},
		{"not a rule", open, &NetworkRequest{Allow: []string{"http://pypi.org/"}}, nil, KindInvalidRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NetworkFor(tc.plan, tc.req)
			if tc.error != 0 {
				var e *Error
				if !errors.As(err, &e) || e.Kind != tc.error {
					t.Fatalf("NetworkFor: %v, want kind %v", err, tc.error)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("NetworkFor = %+v, want %+v", got, tc.want)
			}
		})
	}
}
