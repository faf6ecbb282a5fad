package main

import (
	"context"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/go-rdma/rdmacm/msg"
)

// serverCollector exposes a msg.Server's Stats to Prometheus. It reads a
// snapshot at each scrape: the library keeps its counters itself and knows
// nothing of Prometheus.
type serverCollector struct {
	srv *msg.Server
}

func desc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc("rdmacm_rpc_"+name, help, nil, nil)
}

var (
	callsDesc    = desc("calls_total", "Calls answered, with a response or an error.")
	errorsDesc   = desc("call_errors_total", "Calls answered with an error.")
	inFlightDesc = desc("calls_in_flight", "Handlers running now.")
	connsDesc    = desc("connections", "Connections open now.")
	rttDesc      = desc("conn_keepalive_rtt_max_seconds", "The longest of the open connections' last keepalive round trips.")
	connDescs    = []*prometheus.Desc{
		desc("conn_messages_sent", "Messages sent, summed over the open connections."),
		desc("conn_messages_received", "Messages received, summed over the open connections."),
		desc("conn_credit_waits", "Sends that waited for a credit, summed over the open connections."),
		desc("conn_credit_asks_received", "Messages in which the client asked for credits (its data waited for credits the server had yet to grant), summed over the open connections."),
		desc("conn_rendezvous_bytes_received", "Bytes received by rendezvous (RDMA READ), summed over the open connections."),
		desc("conn_region_cache_hits", "Rendezvous regions the open connections took from their caches, kept registered from an earlier message."),
		desc("conn_region_cache_misses", "Rendezvous regions the open connections mapped and registered anew."),
		desc("conn_send_requests", "Work requests posted to the send queues of the open connections."),
		desc("conn_send_doorbells", "Calls that posted them (one doorbell each)."),
		desc("conn_completions", "Work completions of the open connections."),
		desc("conn_failed_completions", "Work requests the device failed, on the open connections."),
		desc("conn_cq_events", "Completion events (wake-ups of a sleeping completion goroutine) of the open connections."),
	}
)

func (c serverCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range append([]*prometheus.Desc{callsDesc, errorsDesc, inFlightDesc, connsDesc, rttDesc}, connDescs...) {
		ch <- d
	}
}

func (c serverCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.srv.Stats()
	ch <- prometheus.MustNewConstMetric(callsDesc, prometheus.CounterValue, float64(st.Calls))
	ch <- prometheus.MustNewConstMetric(errorsDesc, prometheus.CounterValue, float64(st.Errors))
	ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(st.CallsInFlight))
	ch <- prometheus.MustNewConstMetric(connsDesc, prometheus.GaugeValue, float64(len(st.Conns)))
	// Sums over the connections open now fall when one closes: gauges.
	sums := make([]uint64, len(connDescs))
	var rtt time.Duration
	for _, s := range st.Conns {
		rtt = max(rtt, s.KeepaliveRTT)
		for i, v := range [...]uint64{s.MessagesSent, s.MessagesReceived, s.CreditWaits, s.CreditAsksReceived, s.RendezvousBytesReceived,
			s.RegionCacheHits, s.RegionCacheMisses, s.Endpoint.SendRequests, s.Endpoint.SendDoorbells, s.Endpoint.Completions, s.Endpoint.Failed, s.Endpoint.CQEvents} {
			sums[i] += v
		}
	}
	for i, d := range connDescs {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(sums[i]))
	}
	ch <- prometheus.MustNewConstMetric(rttDesc, prometheus.GaugeValue, rtt.Seconds())
}

// serveMetrics serves srv's counters at http://addr/metrics in the
// Prometheus text format until ctx ends. ready gets the address it
// listens on.
func serveMetrics(ctx context.Context, addr string, srv *msg.Server, ready chan<- string) error {
	reg := prometheus.NewRegistry()
	if err := reg.Register(serverCollector{srv}); err != nil {
		return err
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if ready != nil {
		ready <- l.Addr().String()
	}
	return serveUntil(ctx, func() error { return hs.Serve(l) }, hs.Shutdown)
}
