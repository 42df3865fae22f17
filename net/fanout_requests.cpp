#include "net/fanout_requests.hpp"

#include <fmt/format.h>

#include "caf/all.hpp"
#include "net/request_accounting.hpp"

namespace rlserve::net::detail {

void fanout_requests::send(caf::event_based_actor* self, std::shared_ptr<shared_state> st,
                           std::vector<GenerateReqInput> reqs, bool stream,
                           std::function<void()> on_last) {
  self_ = self;
  st_ = std::move(st);
  on_last_ = std::move(on_last);
  results_.resize(reqs.size());
  pending_ = reqs.size();
  for (auto& req : reqs) {
    req.output_through_sink_only = stream; // fold() keeps a streamed output; the reply, the rest
    const auto& rid = assign_rid(req);
    index_of_.emplace(rid, rids_.size());
    rids_.push_back(rid);
  }
  caf::actor sink = stream ? caf::actor_cast<caf::actor>(self) : caf::actor{};
  for (std::size_t j = 0; j < reqs.size(); ++j)
    self->request(st_->front, caf::infinite, std::move(reqs[j]), sink)
      .then([this, j](GenerateReqOutput& out) { finish(j, std::move(out), true, {}); },
            [this, j](caf::error& err) {
              finish(j, GenerateReqOutput{}, false,
                     "the engine did not answer: " + self_->system().render(err));
            });
}

std::optional<std::size_t> fanout_requests::index_of(const GenerateReqOutput& chunk) const {
  auto it = index_of_.find(chunk.rid);
  if (it == index_of_.end() || !chunk.success)
    return std::nullopt;
  return it->second;
}

std::optional<std::size_t> fanout_requests::fold(GenerateReqOutput chunk) {
  auto j = index_of(chunk);
  if (j)
    append_chunk(results_[*j], std::move(chunk));
  return j;
}

void fanout_requests::abort_all(const std::string& reason) {
  for (const auto& rid : rids_)
    self_->send(st_->front, cancel_atom_v, rid, reason);
}

void fanout_requests::finish(std::size_t j, GenerateReqOutput out, bool answered,
                             const std::string& error) {
  if (answered)
    note_generate(*st_, out);
  if (!(answered && out.success) && failure_.empty()) {
    failure_ = names_.with_rid ? fmt::format("{} {} (rid {}): {}", names_.item, j, rids_[j],
                                             answered ? out.message : error)
                               : fmt::format("{} {}: {}", names_.item, j,
                                             answered ? out.message : error);
    for (std::size_t k = 0; k < rids_.size(); ++k)
      if (k != j)
        self_->send(st_->front, cancel_atom_v, rids_[k],
                    fmt::format("aborted: {} {} of the same {} failed", names_.item, j,
                                names_.whole));
  }
  if (answered) // a streamed output is in results_[j] already: the reply adds the metadata
    append_chunk(results_[j], std::move(out));
  if (--pending_ == 0)
    on_last_();
}

} // namespace rlserve::net::detail
