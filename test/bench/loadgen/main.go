// Command loadgen is the client end of konnect's benchmarks. Each mode prints one JSON object on stdout.
//
//	bulk     GET /bytes from --target over --streams connections (tunnel, SOCKS5 or direct) and report MB/s
//	dial     --count sequential single-use tunnels (or SOCKS5 connections), each with a small GET; latencies
//	scale    --count concurrent tunnels held open at once, then a small GET on each; successes
//	hol      small GETs, one after another, beside --slow readers (and, with --slow-upload, an upload) that
//	         take --slow-rate bytes per second: the quick requests' latencies, and whether every slow
//	         transfer delivered every byte once it was let go at full speed
//
// --via picks the path: "tunnel" (konnectivity-client over the server's UDS, as kube-apiserver dials),
// "socks" (SOCKS5 at --socks), "unix" (a plain connection to --uds, the relays of the tunnel's ceiling) or
// "direct".
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"

	"golang.org/x/net/proxy"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
)

type result struct {
	Mode      string    `json:"mode"`
	Via       string    `json:"via"`
	Bytes     int64     `json:"bytes,omitempty"`
	Seconds   float64   `json:"seconds"`
	MBps      float64   `json:"mbps,omitempty"`
	Count     int       `json:"count,omitempty"`
	OK        int       `json:"ok"`
	Failed    int       `json:"failed"`
	P50ms     float64   `json:"p50_ms,omitempty"`
	P99ms     float64   `json:"p99_ms,omitempty"`
	FirstErr  string    `json:"first_error,omitempty"`
	Latencies []float64 `json:"-"`
}

type dialer func(ctx context.Context) (net.Conn, func(), error)

func main() {
	mode := flag.String("mode", "bulk", "bulk, dial or scale")
	via := flag.String("via", "tunnel", "tunnel, socks, unix or direct")
	uds := flag.String("uds", "", "the tunnel server's UDS (--via tunnel), or the relay's (--via unix)")
	socksAddr := flag.String("socks", "127.0.0.1:1080", "SOCKS5 proxy (--via socks)")
	target := flag.String("target", "", "backend host:port")
	total := flag.Int64("bytes", 1<<30, "bulk: bytes to fetch in all")
	streams := flag.Int("streams", 1, "bulk: concurrent streams sharing --bytes")
	count := flag.Int("count", 1000, "dial/scale: connections")
	readyFile := flag.String("ready-file", "", "scale: touch this file once every connection is open; hol: once the slow transfers have filled what they may hold")
	hold := flag.Duration("hold", 3*time.Second, "scale: keep every connection open this long after --ready-file")
	var ho holOptions
	flag.IntVar(&ho.slow, "slow", 0, "hol: slow readers")
	flag.BoolVar(&ho.upload, "slow-upload", false, "hol: also one slow upload")
	flag.IntVar(&ho.rate, "slow-rate", 64<<10, "hol: the slow readers' pace, bytes per second")
	flag.Int64Var(&ho.slowBytes, "slow-bytes", 8<<20, "hol: bytes of each slow transfer")
	flag.DurationVar(&ho.fill, "fill", 2*time.Second, "hol: how long the slow transfers run before the quick requests")
	flag.DurationVar(&ho.measure, "measure", 5*time.Second, "hol: how long quick requests are sent")
	flag.DurationVar(&ho.quickWait, "quick-timeout", 5*time.Second, "hol: a quick request that takes longer fails")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up after this long")
	flag.Parse()
	if *target == "" {
		fail(errors.New("--target is required"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	var dial dialer
	switch *via {
	case "tunnel":
		if *uds == "" {
			fail(errors.New("--uds is required with --via tunnel"))
		}
		dial = tunnelDialer(*uds, *target)
	case "socks":
		d, err := proxy.SOCKS5("tcp", *socksAddr, nil, &net.Dialer{})
		if err != nil {
			fail(fmt.Errorf("--socks: %w", err))
		}
		cd := d.(proxy.ContextDialer)
		dial = func(ctx context.Context) (net.Conn, func(), error) {
			c, err := cd.DialContext(ctx, "tcp", *target)
			return c, func() {}, err
		}
	case "unix":
		if *uds == "" {
			fail(errors.New("--uds is required with --via unix"))
		}
		dial = func(ctx context.Context) (net.Conn, func(), error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "unix", *uds)
			return c, func() {}, err
		}
	case "direct":
		dial = func(ctx context.Context) (net.Conn, func(), error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", *target)
			return c, func() {}, err
		}
	default:
		fail(fmt.Errorf("--via: unknown path %q", *via))
	}

	if *mode == "hol" {
		ho.readyFile = *readyFile
		r := hol(ctx, dial, *target, ho)
		r.Mode, r.Via = *mode, *via
		_ = json.NewEncoder(os.Stdout).Encode(r)
		return
	}
	var r result
	switch *mode {
	case "bulk":
		r = bulk(ctx, dial, *target, *total, *streams)
	case "dial":
		r = dialLoop(ctx, dial, *target, *count)
	case "scale":
		r = scale(ctx, dial, *target, *count, *readyFile, *hold)
	default:
		fail(fmt.Errorf("--mode: unknown mode %q", *mode))
	}
	r.Mode, r.Via = *mode, *via
	_ = json.NewEncoder(os.Stdout).Encode(r)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "loadgen:", err)
	os.Exit(2)
}

// tunnelDialer opens one single-use gRPC tunnel per connection over the UDS, the way kube-apiserver's egress
// selector does in GRPC mode.
func tunnelDialer(uds, target string) dialer {
	return func(ctx context.Context) (net.Conn, func(), error) {
		tunnelCtx, cancel := context.WithCancel(context.Background())
		t, err := client.CreateSingleUseGrpcTunnelWithContext(ctx, tunnelCtx, "unix:"+uds,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", uds)
			}))
		if err != nil {
			cancel()
			return nil, nil, fmt.Errorf("create tunnel: %w", err)
		}
		c, err := t.DialContext(ctx, "tcp", target)
		if err != nil {
			cancel()
			return nil, nil, fmt.Errorf("dial %s through the tunnel: %w", target, err)
		}
		return c, cancel, nil
	}
}

// get sends one HTTP/1.1 request on c and reads the whole body, returning its length.
func get(c net.Conn, target, path string) (int64, error) {
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, target); err != nil {
		return 0, err
	}
	br := bufio.NewReaderSize(c, 256<<10)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %s", resp.Status)
	}
	return io.CopyBuffer(io.Discard, resp.Body, make([]byte, 256<<10))
}

func bulk(ctx context.Context, dial dialer, target string, total int64, streams int) result {
	per := total / int64(streams)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		r     result
		bytes int64
	)
	start := time.Now()
	for i := 0; i < streams; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := func() (int64, error) {
				c, done, err := dial(ctx)
				if err != nil {
					return 0, err
				}
				defer done()
				defer c.Close()
				stop := context.AfterFunc(ctx, func() { c.Close() })
				defer stop()
				return get(c, target, fmt.Sprintf("/bytes?n=%d", per))
			}()
			mu.Lock()
			defer mu.Unlock()
			bytes += n
			if err != nil || n != per {
				r.Failed++
				if r.FirstErr == "" {
					r.FirstErr = fmt.Sprintf("got %d of %d bytes: %v", n, per, err)
				}
				return
			}
			r.OK++
		}()
	}
	wg.Wait()
	r.Seconds = time.Since(start).Seconds()
	r.Bytes = bytes
	r.MBps = float64(bytes) / 1e6 / r.Seconds
	return r
}

func dialLoop(ctx context.Context, dial dialer, target string, count int) result {
	var r result
	start := time.Now()
	for i := 0; i < count && ctx.Err() == nil; i++ {
		t0 := time.Now()
		err := func() error {
			c, done, err := dial(ctx)
			if err != nil {
				return err
			}
			defer done()
			defer c.Close()
			_, err = get(c, target, "/small")
			return err
		}()
		if err != nil {
			r.Failed++
			if r.FirstErr == "" {
				r.FirstErr = err.Error()
			}
			continue
		}
		r.OK++
		r.Latencies = append(r.Latencies, float64(time.Since(t0).Microseconds())/1000)
	}
	r.Seconds = time.Since(start).Seconds()
	r.Count = count
	r.P50ms, r.P99ms = percentile(r.Latencies, 50), percentile(r.Latencies, 99)
	return r
}

func scale(ctx context.Context, dial dialer, target string, count int, readyFile string, hold time.Duration) result {
	type open struct {
		c    net.Conn
		done func()
	}
	var (
		r     result
		mu    sync.Mutex
		conns []open
		wg    sync.WaitGroup
		sem   = make(chan struct{}, 64) // bound the dial burst, not the number held open
	)
	start := time.Now()
	for i := 0; i < count; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, done, err := dial(ctx)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				r.Failed++
				if r.FirstErr == "" {
					r.FirstErr = err.Error()
				}
				return
			}
			conns = append(conns, open{c, done})
		}()
	}
	wg.Wait()
	if readyFile != "" {
		_ = os.WriteFile(readyFile, []byte(fmt.Sprint(len(conns))), 0o644)
	}
	select {
	case <-time.After(hold):
	case <-ctx.Done():
	}
	for _, o := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer o.done()
			defer o.c.Close()
			_, err := get(o.c, target, "/small")
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				r.Failed++
				if r.FirstErr == "" {
					r.FirstErr = err.Error()
				}
				return
			}
			r.OK++
		}()
	}
	wg.Wait()
	r.Count = count
	r.Seconds = time.Since(start).Seconds()
	return r
}

func percentile(ms []float64, p float64) float64 {
	if len(ms) == 0 {
		return 0
	}
	s := append([]float64(nil), ms...)
	sort.Float64s(s)
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}
