package proxytest

import dto "github.com/prometheus/client_model/go"

// MetricValue is the value of the series name{labels} among families (gathered
// from a registry, or parsed from a scrape): a counter's or gauge's value, a
// histogram's sample count; 0 when there is no such series. labels are name,
// value pairs and must be exactly the series' labels.
func MetricValue(families []*dto.MetricFamily, name string, labels ...string) float64 {
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if labelsAre(m.GetLabel(), labels) {
				return value(m)
			}
		}
	}
	return 0
}

// MetricSum adds the values (histograms: sample counts) of every series of name.
func MetricSum(families []*dto.MetricFamily, name string) float64 {
	var total float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			total += value(m)
		}
	}
	return total
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	case m.Histogram != nil:
		return float64(m.GetHistogram().GetSampleCount())
	}
	return 0
}

func labelsAre(got []*dto.LabelPair, want []string) bool {
	if len(got)*2 != len(want) {
		return false
	}
	for i := 0; i+1 < len(want); i += 2 {
		found := false
		for _, l := range got {
			found = found || (l.GetName() == want[i] && l.GetValue() == want[i+1])
		}
		if !found {
			return false
		}
	}
	return true
}
