package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// holOptions are the head-of-line mode's settings.
type holOptions struct {
	slow      int           // slow readers, each downloading slowBytes
	upload    bool          // also one slow upload of slowBytes, to a backend that reads slowly
	rate      int           // the slow readers' and the slow backend's pace, bytes per second
	slowBytes int64         // each slow transfer
	fill      time.Duration // how long the slow transfers run before the quick requests start
	measure   time.Duration // how long quick requests are sent, one after another
	quickWait time.Duration // a quick request that takes longer has failed
	readyFile string        // touched once the slow transfers have filled what they may hold
}

// holResult adds the slow transfers' outcome to a result.
type holResult struct {
	result
	SlowOK    int   `json:"slow_ok"`    // slow transfers that delivered every byte
	SlowBytes int64 `json:"slow_bytes"` // bytes they delivered in all
}

// pace is a slow transfer's pace: bytes per second, or, once the quick requests are done, as fast as it can.
type pace struct{ fast atomic.Bool }

type pacedReader struct {
	r    io.Reader
	rate int
	p    *pace
}

func (s pacedReader) Read(b []byte) (int, error) {
	if s.p.fast.Load() {
		return s.r.Read(b)
	}
	n, err := s.r.Read(b[:min(len(b), 8<<10)])
	time.Sleep(time.Duration(float64(time.Second) * float64(n) / float64(s.rate)))
	return n, err
}

// hol measures quick requests through a tunnel that slow transfers share: o.slow downloads read at o.rate
// (and, with o.upload, an upload to a backend that reads at o.rate), all larger than what the path buffers
// for them, so that they are held back by their readers while the quick requests run. Then the slow
// transfers speed up and must each deliver every byte.
func hol(ctx context.Context, dial dialer, target string, o holOptions) holResult {
	var (
		r     holResult
		p     pace
		wg    sync.WaitGroup
		mu    sync.Mutex
		slows = o.slow
	)
	slowDone := func(n, want int64, err error) {
		mu.Lock()
		defer mu.Unlock()
		r.SlowBytes += n
		if err == nil && n == want {
			r.SlowOK++
		} else if r.FirstErr == "" {
			r.FirstErr = fmt.Sprintf("slow transfer: %d of %d bytes: %v", n, want, err)
		}
	}
	for range o.slow {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, done, err := dial(ctx)
			if err != nil {
				slowDone(0, o.slowBytes, err)
				return
			}
			defer done()
			defer c.Close()
			stop := context.AfterFunc(ctx, func() { c.Close() })
			defer stop()
			if _, err := fmt.Fprintf(c, "GET /bytes?n=%d HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", o.slowBytes, target); err != nil {
				slowDone(0, o.slowBytes, err)
				return
			}
			res, err := http.ReadResponse(bufio.NewReaderSize(pacedReader{c, o.rate, &p}, 8<<10), nil)
			if err != nil {
				slowDone(0, o.slowBytes, err)
				return
			}
			n, err := io.Copy(io.Discard, res.Body)
			slowDone(n, o.slowBytes, err)
		}()
	}
	if o.upload {
		slows++
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := slowUpload(ctx, dial, target, o)
			slowDone(n, o.slowBytes, err)
		}()
	}

	time.Sleep(o.fill)
	if o.readyFile != "" {
		_ = os.WriteFile(o.readyFile, []byte("filled"), 0o644)
	}
	start := time.Now()
	for time.Since(start) < o.measure && ctx.Err() == nil {
		t0 := time.Now()
		qctx, cancel := context.WithTimeout(ctx, o.quickWait)
		err := func() error {
			c, done, err := dial(qctx)
			if err != nil {
				return err
			}
			defer done()
			defer c.Close()
			stop := context.AfterFunc(qctx, func() { c.Close() })
			defer stop()
			_, err = get(c, target, "/small")
			return err
		}()
		cancel()
		if err != nil {
			r.Failed++
			if r.FirstErr == "" {
				r.FirstErr = "quick request: " + err.Error()
			}
			// A failed request counts at the bound it failed at.
			r.Latencies = append(r.Latencies, float64(o.quickWait.Microseconds())/1000)
			continue
		}
		r.OK++
		r.Latencies = append(r.Latencies, float64(time.Since(t0).Microseconds())/1000)
	}
	r.Seconds = time.Since(start).Seconds()
	r.Count = r.OK + r.Failed
	r.P50ms, r.P99ms = percentile(r.Latencies, 50), percentile(r.Latencies, 99)
	p.fast.Store(true)
	wg.Wait()
	if r.SlowOK != slows && r.FirstErr == "" {
		r.FirstErr = fmt.Sprintf("%d of %d slow transfers delivered every byte", r.SlowOK, slows)
	}
	return r
}

// slowUpload sends o.slowBytes to the backend's /sink, which reads at o.rate for as long as the quick
// requests run and then as fast as it can, and returns how many bytes the backend says it received.
func slowUpload(ctx context.Context, dial dialer, target string, o holOptions) (int64, error) {
	c, done, err := dial(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	slowFor := o.fill + o.measure
	if _, err := fmt.Fprintf(c, "POST /sink?rate=%d&slow=%s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n",
		o.rate, slowFor, target, o.slowBytes); err != nil {
		return 0, err
	}
	if _, err := io.CopyN(c, zeroReader{}, o.slowBytes); err != nil {
		return 0, err
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 64))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(string(body), 10, 64)
}

type zeroReader struct{}

func (zeroReader) Read(b []byte) (int, error) { clear(b); return len(b), nil }
