//! AdamW exactly as rl.md §8 writes it, with f32 moments (and f32 master weights when the model
//! trains in bf16/f16), plus global gradient-norm clipping.
//! Every in-place update checks its result: a failed one is an error, never a skipped update
//! (`let _ = t.f_op_(..)?` drops the returned handle to the same storage; `?` passes the error on).
use comas_model::foreach::{self, AdamWStep};
use std::collections::BTreeMap;
use tch::{Kind, TchError, Tensor};

pub struct AdamW {
    params: Vec<(String, Tensor)>,
    /// f32 copies of parameters kept in a lower precision.
    master: Vec<Option<Tensor>>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    /// Updates applied so far (for bias correction).
    pub steps: u64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
}

impl AdamW {
    pub fn new(
        params: Vec<(String, Tensor)>,
        betas: (f64, f64),
        eps: f64,
        weight_decay: f64,
    ) -> Self {
        let _g = tch::no_grad_guard();
        let master = params
            .iter()
            .map(|(_, p)| (p.kind() != Kind::Float).then(|| p.to_kind(Kind::Float).detach()))
            .collect();
        let zeros = |p: &Tensor| Tensor::zeros(p.size(), (Kind::Float, p.device()));
        let m = params.iter().map(|(_, p)| zeros(p)).collect();
        let v = params.iter().map(|(_, p)| zeros(p)).collect();
        Self { params, master, m, v, steps: 0, betas, eps, weight_decay }
    }

    pub fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }

    pub fn zero_grad(&self) -> Result<(), TchError> {
        for (_, p) in &self.params {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.f_zero_()?;
            }
        }
        Ok(())
    }

    /// sqrt(sum of squared gradient norms), in f64: each parameter's sum on its device, then one
    /// copy of them all to the host (one wait for the device, not one per parameter), added up
    /// there in parameter order.
    pub fn grad_norm(&self) -> f64 {
        let sums: Vec<Tensor> = self
            .params
            .iter()
            .map(|(_, p)| p.grad())
            .filter(Tensor::defined)
            .map(|g| g.to_kind(Kind::Double).square().sum(Kind::Double))
            .collect();
        if sums.is_empty() {
            return 0.0;
        }
        let host = Tensor::stack(&sums, 0).to_device(tch::Device::Cpu);
        let sums = Vec::<f64>::try_from(&host).expect("f64 gradient sums");
        sums.iter().sum::<f64>().sqrt()
    }

    /// Scales gradients so their global norm is at most `max_norm` (given the measured `norm`).
    pub fn clip_grad(&self, norm: f64, max_norm: f64) -> Result<(), TchError> {
        if max_norm > 0.0 && norm > max_norm {
            let scale = max_norm / (norm + 1e-6);
            for (_, p) in &self.params {
                let mut g = p.grad();
                if g.defined() {
                    let _ = g.f_mul_scalar_(scale)?;
                }
            }
        }
        Ok(())
    }

    /// One update of every parameter that has a gradient, all in one foreach call
    /// (`comas_model::foreach`), then the bf16/f16 parameters copied from their f32 masters.
    pub fn step(&mut self, lr: f64) -> Result<(), TchError> {
        let _g = tch::no_grad_guard();
        self.steps += 1;
        let k = self.steps as i32;
        let (b1, b2) = self.betas;
        let (mut w, mut g, mut m, mut v, mut copies) = (vec![], vec![], vec![], vec![], vec![]);
        for (i, (_, p)) in self.params.iter().enumerate() {
            let grad = p.grad();
            if !grad.defined() {
                continue;
            }
            let weights = match &self.master[i] {
                Some(master) => {
                    copies.push((p.shallow_clone(), master.shallow_clone()));
                    master.shallow_clone()
                }
                None => p.shallow_clone(),
            };
            w.push(weights);
            g.push(grad);
            m.push(self.m[i].shallow_clone());
            v.push(self.v[i].shallow_clone());
        }
        let step = AdamWStep {
            lr,
            betas: (b1, b2),
            bias_corrections: (1.0 - b1.powi(k), 1.0 - b2.powi(k)),
            eps: self.eps,
            decay: if self.weight_decay != 0.0 { 1.0 - lr * self.weight_decay } else { 1.0 },
        };
        foreach::adamw(&w, &g, &m, &v, step).map_err(|e| TchError::Torch(e.to_string()))?;
        for (mut p, master) in copies {
            let _ = p.f_copy_(&master)?;
        }
        Ok(())
    }

    /// Optimizer state by name for checkpoints: `m.<param>`, `v.<param>`, `master.<param>`.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for (i, (name, _)) in self.params.iter().enumerate() {
            out.push((format!("m.{name}"), self.m[i].shallow_clone()));
            out.push((format!("v.{name}"), self.v[i].shallow_clone()));
            if let Some(m) = &self.master[i] {
                out.push((format!("master.{name}"), m.shallow_clone()));
            }
        }
        out
    }

    /// Restores moments (and master weights) saved by `state_tensors`; every tensor must be there.
    pub fn load_state(
        &mut self,
        tensors: &BTreeMap<String, Tensor>,
        steps: u64,
    ) -> Result<(), String> {
        let _g = tch::no_grad_guard();
        let get = |key: String, like: &Tensor| -> Result<Tensor, String> {
            let t = tensors.get(&key).ok_or_else(|| format!("optimizer state lacks `{key}`"))?;
            if t.size() != like.size() {
                return Err(format!(
                    "optimizer state `{key}` has shape {:?}, expected {:?}",
                    t.size(),
                    like.size()
                ));
            }
            Ok(t.to_kind(Kind::Float).to_device(like.device()))
        };
        for i in 0..self.params.len() {
            let name = self.params[i].0.clone();
            self.m[i] = get(format!("m.{name}"), &self.m[i])?;
            self.v[i] = get(format!("v.{name}"), &self.v[i])?;
            if let Some(m) = &self.master[i] {
                self.master[i] = Some(get(format!("master.{name}"), m)?);
            }
        }
        self.steps = steps;
        Ok(())
    }

    /// Deep copy of parameters, master weights and moments, to undo a failed step.
    pub fn snapshot(&self) -> Snapshot {
        let _g = tch::no_grad_guard();
        Snapshot {
            params: self.params.iter().map(|(_, p)| p.detach().copy()).collect(),
            master: self.master.iter().map(|m| m.as_ref().map(Tensor::copy)).collect(),
            m: self.m.iter().map(Tensor::copy).collect(),
            v: self.v.iter().map(Tensor::copy).collect(),
            steps: self.steps,
        }
    }

    pub fn restore(&mut self, s: Snapshot) -> Result<(), TchError> {
        let _g = tch::no_grad_guard();
        for ((_, p), saved) in self.params.iter().zip(&s.params) {
            let _ = p.shallow_clone().f_copy_(saved)?;
        }
        self.master = s.master;
        self.m = s.m;
        self.v = s.v;
        self.steps = s.steps;
        self.zero_grad()
    }
}

pub struct Snapshot {
    params: Vec<Tensor>,
    master: Vec<Option<Tensor>>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    steps: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_step_matches_the_formula() {
        let p = Tensor::from_slice(&[1.0f32, -2.0]).set_requires_grad(true);
        let loss = (&p * Tensor::from_slice(&[0.5f32, 0.25])).sum(Kind::Float);
        loss.backward();
        let mut opt = AdamW::new(vec![("p".into(), p.shallow_clone())], (0.9, 0.95), 1e-8, 0.1);
        opt.step(0.01).unwrap();
        // decay then Adam: m̂ = g, v̂ = g², update = lr * g / (|g| + eps)
        let want = [
            1.0 * (1.0 - 0.001) - 0.01 * 0.5 / (0.5 + 1e-8),
            -2.0 * (1.0 - 0.001) - 0.01 * 0.25 / (0.25 + 1e-8),
        ];
        let got = Vec::<f32>::try_from(&p.detach()).unwrap();
        for (a, b) in got.iter().zip(want) {
            assert!((*a as f64 - b).abs() < 1e-6, "{a} vs {b}");
        }
    }

    /// The per-parameter loop the foreach update replaced, operation for operation.
    fn loop_step(p: &[Tensor], g: &[Tensor], m: &[Tensor], v: &[Tensor], k: i32, lr: f64) {
        let (b1, b2, eps, wd) = (0.9, 0.95, 1e-8, 0.1);
        let (bc1, bc2) = (1.0 - f64::powi(b1, k), 1.0 - f64::powi(b2, k));
        for i in 0..p.len() {
            let mut w = p[i].shallow_clone();
            let (mut mi, mut vi) = (m[i].shallow_clone(), v[i].shallow_clone());
            let _ = w.f_mul_scalar_(1.0 - lr * wd).unwrap();
            let _ = mi
                .f_mul_scalar_(b1)
                .unwrap()
                .f_add_(&g[i].f_mul_scalar(1.0 - b1).unwrap())
                .unwrap();
            let g2 = g[i].f_square().unwrap().f_mul_scalar(1.0 - b2).unwrap();
            let _ = vi.f_mul_scalar_(b2).unwrap().f_add_(&g2).unwrap();
            let denom = v[i].f_div_scalar(bc2).unwrap().sqrt().f_add_scalar(eps).unwrap();
            let update = m[i].f_div_scalar(bc1).unwrap().f_div(&denom).unwrap();
            let _ = w.f_sub_(&update.f_mul_scalar(lr).unwrap()).unwrap();
        }
    }

    #[test]
    fn the_foreach_update_equals_the_per_parameter_loop_bit_for_bit() {
        let shapes: [&[i64]; 3] = [&[7, 5], &[5], &[3, 4, 2]];
        let params: Vec<Tensor> = shapes
            .iter()
            .map(|s| Tensor::randn(*s, (Kind::Float, tch::Device::Cpu)).set_requires_grad(true))
            .collect();
        let named = params.iter().enumerate().map(|(i, p)| (format!("p{i}"), p.shallow_clone()));
        let mut opt = AdamW::new(named.collect(), (0.9, 0.95), 1e-8, 0.1);
        let plain: Vec<Tensor> = params.iter().map(|p| p.detach().copy()).collect();
        let zeros = |t: &Tensor| t.zeros_like();
        let (m, v): (Vec<Tensor>, Vec<Tensor>) = plain.iter().map(|p| (zeros(p), zeros(p))).unzip();
        for k in 1..=3 {
            let grads: Vec<Tensor> = params.iter().map(Tensor::randn_like).collect();
            // d/dp Σ p·g = g exactly.
            opt.zero_grad().unwrap();
            let loss = params
                .iter()
                .zip(&grads)
                .map(|(p, g)| (p * g).sum(Kind::Float))
                .reduce(|a, b| a + b)
                .unwrap();
            loss.backward();
            opt.step(1e-2).unwrap();
            tch::no_grad(|| loop_step(&plain, &grads, &m, &v, k, 1e-2));
            for (a, b) in params.iter().zip(&plain) {
                let bits = |t: &Tensor| -> Vec<u32> {
                    let t = t.detach().view([-1]);
                    Vec::<f32>::try_from(&t).unwrap().iter().map(|x| x.to_bits()).collect()
                };
                assert_eq!(bits(a), bits(b), "step {k}");
            }
        }
    }

    #[test]
    fn a_failed_update_is_an_error_not_a_skipped_step() {
        let p = Tensor::from_slice(&[1.0f32, -2.0]).set_requires_grad(true);
        (&p * 2.0).sum(Kind::Float).backward();
        let mut opt = AdamW::new(vec![("p".into(), p.shallow_clone())], (0.9, 0.95), 1e-8, 0.0);
        // A first moment of the wrong shape (as a corrupt state would give): the in-place add fails.
        opt.m[0] = Tensor::zeros([3], (Kind::Float, tch::Device::Cpu));
        assert!(opt.step(0.01).is_err());
    }

    #[test]
    fn clipping_scales_to_max_norm() {
        let p = Tensor::from_slice(&[3.0f32, 4.0]).set_requires_grad(true);
        (&p * &p / 2.0).sum(Kind::Float).backward(); // grad = p, norm 5
        let opt = AdamW::new(vec![("p".into(), p.shallow_clone())], (0.9, 0.95), 1e-8, 0.0);
        let n = opt.grad_norm();
        assert!((n - 5.0).abs() < 1e-9);
        opt.clip_grad(n, 1.0).unwrap();
        assert!((opt.grad_norm() - 5.0 / (5.0 + 1e-6)).abs() < 1e-6);
    }
}
