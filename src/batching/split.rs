//! Splitting one upstream embeddings answer back into each member's own answer: its items,
//! `index` renumbered from 0, and its share of `usage` (shares in proportion to its estimated
//! tokens, summing exactly to what the backend reported).

use serde_json::{Map, Value};

/// Why a batch's answer could not be split (the members then get a 502 that says so).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    /// Not a JSON object with a `data` array.
    #[error("the backend's answer to a batch is not an embeddings list: {0}")]
    NotAList(String),
    /// An item is missing, repeated, or its `index` is out of range.
    #[error("the backend's answer to a batch of {expected} inputs does not hold each input's embedding once")]
    Items {
        /// Items sent.
        expected: usize,
    },
}

/// `total` shared in proportion to `weights`, by largest remainder: the shares add up to
/// `total` exactly. Equal shares when every weight is 0.
pub fn apportion(total: u64, weights: &[u64]) -> Vec<u64> {
    if weights.is_empty() {
        return Vec::new();
    }
    let ones = vec![1; weights.len()];
    let weights = if weights.iter().all(|&w| w == 0) {
        &ones
    } else {
        weights
    };
    let sum: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    let exact: Vec<(u64, u128)> = weights
        .iter()
        .map(|&w| {
            let scaled = u128::from(total) * u128::from(w);
            ((scaled / sum) as u64, scaled % sum)
        })
        .collect();
    let mut shares: Vec<u64> = exact.iter().map(|&(q, _)| q).collect();
    let left = total - shares.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..shares.len()).collect();
    // Largest remainder first; ties to the earlier member.
    order.sort_by(|&a, &b| exact[b].1.cmp(&exact[a].1).then(a.cmp(&b)));
    for &i in order.iter().take(left as usize) {
        shares[i] += 1;
    }
    shares
}

/// Splits `answer` (the backend's 200 to a batch) into one JSON body per member: member `m`
/// sent `counts[m]` items, in member order, and weighs `weights[m]` in the usage shares.
pub fn split(answer: &[u8], counts: &[usize], weights: &[u64]) -> Result<Vec<Vec<u8>>, SplitError> {
    let not_a_list = |why: &str| SplitError::NotAList(why.to_string());
    let Value::Object(mut top): Value =
        serde_json::from_slice(answer).map_err(|e| not_a_list(&e.to_string()))?
    else {
        return Err(not_a_list("not a JSON object"));
    };
    let Some(Value::Array(data)) = top.remove("data") else {
        return Err(not_a_list("no data array"));
    };
    let expected: usize = counts.iter().sum();
    let mut by_index: Vec<Option<Value>> = vec![None; expected];
    for item in data {
        let index = item.get("index").and_then(Value::as_u64);
        match index.and_then(|i| by_index.get_mut(i as usize)) {
            Some(slot @ None) => *slot = Some(item),
            _ => return Err(SplitError::Items { expected }),
        }
    }
    let mut items = by_index.into_iter();
    let usage = top.remove("usage");
    let shares = |key: &str| {
        let total = usage
            .as_ref()
            .and_then(|u| u.get(key))
            .and_then(Value::as_u64);
        total.map(|t| apportion(t, weights))
    };
    let (prompt, total) = (shares("prompt_tokens"), shares("total_tokens"));
    let mut bodies = Vec::with_capacity(counts.len());
    for (m, &count) in counts.iter().enumerate() {
        let mut own = Vec::with_capacity(count);
        for index in 0..count {
            let mut item = items
                .next()
                .flatten()
                .ok_or(SplitError::Items { expected })?;
            item["index"] = Value::from(index);
            own.push(item);
        }
        let mut body: Map<String, Value> = top.clone();
        body.insert("data".into(), Value::Array(own));
        if let Some(Value::Object(usage)) = &usage {
            let mut mine = usage.clone();
            for (key, shares) in [("prompt_tokens", &prompt), ("total_tokens", &total)] {
                if let Some(shares) = shares {
                    mine.insert(key.into(), Value::from(shares[m]));
                }
            }
            body.insert("usage".into(), Value::Object(mine));
        }
        bodies.push(serde_json::to_vec(&body).unwrap_or_default());
    }
    Ok(bodies)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn shares_are_proportional_and_add_up_exactly() {
        assert_eq!(apportion(10, &[1, 1, 1]), [4, 3, 3]);
        assert_eq!(apportion(100, &[1, 3]), [25, 75]);
        assert_eq!(apportion(7, &[0, 0]), [4, 3]);
        assert_eq!(apportion(0, &[5, 2]), [0, 0]);
        assert_eq!(apportion(5, &[]), Vec::<u64>::new());
        let shares = apportion(1_000_003, &[7, 11, 13, 17, 1]);
        assert_eq!(shares.iter().sum::<u64>(), 1_000_003);
    }

    fn answer(n: usize, shuffled: bool) -> Vec<u8> {
        let mut data: Vec<Value> = (0..n)
            .map(|i| json!({"object": "embedding", "index": i, "embedding": [i as f64]}))
            .collect();
        if shuffled {
            data.reverse();
        }
        json!({"object": "list", "model": "e", "data": data,
               "usage": {"prompt_tokens": 10, "total_tokens": 10}})
        .to_string()
        .into_bytes()
    }

    #[test]
    fn each_member_gets_its_items_renumbered_and_its_usage_share() {
        for shuffled in [false, true] {
            let bodies = split(&answer(4, shuffled), &[1, 2, 1], &[1, 3, 1]).unwrap();
            let v: Vec<Value> = bodies
                .iter()
                .map(|b| serde_json::from_slice(b).unwrap())
                .collect();
            assert_eq!(
                v[1]["data"],
                json!([
                    {"object": "embedding", "index": 0, "embedding": [1.0]},
                    {"object": "embedding", "index": 1, "embedding": [2.0]},
                ])
            );
            assert_eq!(v[2]["data"][0]["embedding"], json!([3.0]));
            assert_eq!(
                (v[0]["object"].as_str(), v[0]["model"].as_str()),
                (Some("list"), Some("e"))
            );
            let usage: Vec<u64> = v
                .iter()
                .map(|b| b["usage"]["prompt_tokens"].as_u64().unwrap())
                .collect();
            assert_eq!(usage, [2, 6, 2]);
            assert_eq!(v[1]["usage"]["total_tokens"], 6);
        }
    }

    #[test]
    fn an_answer_missing_or_repeating_an_item_is_refused() {
        assert_eq!(
            split(&answer(3, false), &[2, 2], &[1, 1]),
            Err(SplitError::Items { expected: 4 })
        );
        let twice = json!({"data": [{"index": 0}, {"index": 0}]}).to_string();
        assert!(split(twice.as_bytes(), &[2], &[1]).is_err());
        assert!(matches!(
            split(b"[]", &[1], &[1]),
            Err(SplitError::NotAList(_))
        ));
        assert!(matches!(
            split(b"{\"data\": 5}", &[1], &[1]),
            Err(SplitError::NotAList(_))
        ));
    }
}
