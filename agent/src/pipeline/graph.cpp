#include "pipeline/graph.hpp"

#include <thread>

namespace numastream {

bool StageGraph::Stage_::admit(int n) {
  std::lock_guard lock(mu_);
  if (over_) return false;
  left_ += n;
  return true;
}

void StageGraph::Stage_::ended() {
  bool last = false;
  {
    std::lock_guard lock(mu_);
    last = --left_ == 0;
    if (last) over_ = true;
  }
  if (last && w_.done) w_.done();
}

StageGraph::Stage_& StageGraph::add(Workers w) {
  stages_.push_back(std::unique_ptr<Stage_>(new Stage_(std::move(w))));
  return *stages_.back();
}

void StageGraph::run(const std::function<void()>& supervise) {
  // A stage without workers is over before it starts (its output closed at once).
  for (auto& s : stages_) {
    bool none = false;
    {
      std::lock_guard lock(s->mu_);
      none = s->left_ == 0 && !s->over_;
      if (none) s->over_ = true;
    }
    if (none && s->w_.done) s->w_.done();
  }
  std::vector<std::vector<std::jthread>> threads(stages_.size());
  for (std::size_t k = 0; k < stages_.size(); ++k) {
    Stage_& s = *stages_[k];
    const Workers& w = s.w_;
    auto worker = [&s, &w](const std::function<void()>& run) {
      return [&s, &w, run] {
        run();
        if (w.after_each) w.after_each();
        s.ended();
      };
    };
    for (int i = 0; i < w.threads; ++i) {
      threads[k].emplace_back(
          worker([this, &w, i] { rt_.run_stage(w.stage, i, w.what(i), w.body); }));
    }
    const int first_spare = w.spare_index >= 0 ? w.spare_index : w.threads;
    for (int j = 0; j < w.spares; ++j) {
      threads[k].emplace_back(worker([this, &w, j, first_spare] {
        rt_.run_spare(w.stage, first_spare + j, w.host, w.host_first + j, w.what(first_spare + j),
                      w.body);
      }));
    }
  }
  if (supervise) supervise();
  for (std::size_t k = 0; k < stages_.size(); ++k) {
    threads[k].clear();  // joins
    if (stages_[k]->w_.joined) stages_[k]->w_.joined();
  }
}

}  // namespace numastream
