package secretmanager

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/meshagent/meshagent/internal/pki"
)

// job signs a CSR of a key of its own for id through c.m.SignCSR in a
// goroutine; the result arrives on the returned channel.
func (c *cache) job(id pki.Identity) <-chan error {
	c.t.Helper()
	key, err := pki.GenerateKey(pki.ECP256)
	if err != nil {
		c.t.Fatal(err)
	}
	csr, err := pki.NewCSR(key, id)
	if err != nil {
		c.t.Fatal(err)
	}
	out := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s, err := c.m.SignCSR(ctx, CSRJob{CSR: csr, PublicKey: key.Public(), Identity: id, TTL: time.Hour})
		if err == nil && !pki.PublicKeysEqual(s.Chain[0].PublicKey, key.Public()) {
			err = errors.New("the certificate is not for the job's key")
		}
		out <- err
	}()
	return out
}

// Certificates asked for by SDS callers (blocked in Secret), Workload API
// subscribers (Watch) and one-shot CSR jobs (Pod Certificates) all arriving
// together share one budget: the CA never sees more than
// MaxConcurrentCSRs requests at once, and every one is answered.
func TestOneBudgetForCacheAndJobs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const budget, each = 3, 4
		c := newCache(t, func(cfg *Config) { cfg.MaxConcurrentCSRs = budget })
		var secrets []<-chan *Secret
		var jobs []<-chan error
		for i := range each {
			secrets = append(secrets, c.wait(ident(i)))
			_, stop := c.m.Watch(ident(100+i), WorkloadCertName)
			t.Cleanup(stop)
			jobs = append(jobs, c.job(ident(200+i)))
		}
		// The budget's calls are out together; then each release frees the
		// slot of the next.
		var out []*call
		for range budget {
			out = append(out, c.signer.nextCall(t))
		}
		for n := budget; len(out) > 0; {
			out[0].release <- nil
			out = out[1:]
			if n < 3*each {
				out = append(out, c.signer.nextCall(t))
				n++
			}
		}
		for _, s := range secrets {
			recv(t, s)
		}
		for _, j := range jobs {
			select {
			case err := <-j:
				if err != nil {
					t.Errorf("job: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("job still waiting")
			}
		}
		for i := range each {
			c.waitFor("the subscriber's certificate", func() bool { _, err := c.m.Current(ident(100+i), WorkloadCertName); return err == nil })
		}
		if p := c.signer.peak(); p != budget {
			t.Errorf("at most %d requests at the CA at once, want the budget, %d", p, budget)
		}
	})
}
