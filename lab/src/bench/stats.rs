//! Percentiles of samples, as every section reports them.

/// The `p` percentile (0 to 1) of `sorted` samples, the nearest rank; NaN
/// when there are none.
pub(super) fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The samples in ascending order.
pub(super) fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}
