package secretmanager_test

import (
	"context"
	"fmt"
	"time"

	"github.com/meshagent/meshagent/caclient/devca"
	"github.com/meshagent/meshagent/internal/pki"
	"github.com/meshagent/meshagent/internal/secret"
	"github.com/meshagent/meshagent/secretmanager"
)

// The manager of `meshagent run --dev`: an in-process CA, its root as the
// trust bundle, and a subscriber that learns of every new certificate.
func Example() {
	ca, err := devca.New(devca.Config{})
	if err != nil {
		panic(err)
	}
	roots, err := secret.NewRoots(ca.CA().RootPEM(), "dev-ca")
	if err != nil {
		panic(err)
	}
	m, err := secretmanager.New(secretmanager.Config{
		Identity: pki.SPIFFEIdentity("cluster.local", "default", "sleep"),
		CA:       ca,
		Roots:    roots,
		Source:   "dev-ca",
		TTL:      24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, MaxConcurrentCSRs: 8, IdleGrace: time.Minute,
	})
	if err != nil {
		panic(err)
	}
	// Subscribe before Run, so no publication is missed.
	changed, stop := m.Watch(pki.Identity{}, secretmanager.WorkloadCertName) // zero: the own identity
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx) }()

	wait, cancelWait := context.WithTimeout(ctx, 10*time.Second)
	defer cancelWait()
	s, err := m.Secret(wait, pki.Identity{}, secretmanager.WorkloadCertName)
	if err != nil {
		panic(err)
	}
	<-changed // the first publication was signalled too
	fmt.Println(s.Identity, s.Source, m.Ready() == nil)

	// /debug/certs lists what Certs returns: the certificate, then the roots.
	for _, c := range m.Certs() {
		fmt.Println(c.ResourceName)
	}
	cancel()
	<-done
	// Output:
	// spiffe://cluster.local/ns/default/sa/sleep dev-ca true
	// default
	// ROOTCA
}

// A manager without an own identity, as a node agent runs it: "default"
// means the identity of each caller, carried by the RPC context, and
// Prefetch asks for an identity before its first caller arrives.
func ExampleManager_Prefetch() {
	ca, err := devca.New(devca.Config{})
	if err != nil {
		panic(err)
	}
	roots, err := secret.NewRoots(ca.CA().RootPEM(), "dev-ca")
	if err != nil {
		panic(err)
	}
	m, err := secretmanager.New(secretmanager.Config{CA: ca, Roots: roots, MaxConcurrentCSRs: 4, TTL: 24 * time.Hour, GraceRatio: 0.5, GraceJitter: 0.01, IdleGrace: time.Minute})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx) }()

	web := pki.SPIFFEIdentity("cluster.local", "shop", "web")
	if err := m.Prefetch(web); err != nil { // a pod of shop/web is scheduled here
		panic(err)
	}
	defer m.Release(web) // its last pod is gone

	for _, sa := range []string{"web", "db"} {
		id := pki.SPIFFEIdentity("cluster.local", "shop", sa) // as sds or workloadapi resolved the caller
		wait, cancelWait := context.WithTimeout(ctx, 10*time.Second)
		s, err := m.Secret(wait, id, secretmanager.WorkloadCertName)
		cancelWait()
		if err != nil {
			panic(err)
		}
		fmt.Println(s.Identity)
	}
	cancel()
	<-done
	// Output:
	// spiffe://cluster.local/ns/shop/sa/web
	// spiffe://cluster.local/ns/shop/sa/db
}
