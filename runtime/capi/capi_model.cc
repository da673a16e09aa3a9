// The C entry points for devices, models and execution (neuronish_runtime.h); the work
// is in device.cc, model.cc and engine_program.cc. No exception crosses the C API.
#include <memory>

#include "device.h"
#include "handles.h"
#include "model.h"
#include "observe.h"

struct nr_device {
  std::shared_ptr<nr::Device> device;
};

struct nr_model {
  std::unique_ptr<nr::Model> model;
  nr_executable exe;  // the executable handle nr_model_executable returns
};

using nr::guarded;
using nr::report;

namespace {

// Load an executable with `read` (nr_executable_load_bytes or _file), then the model.
template <typename Read>
nr_status load_model(nr_device *dev, uint32_t duplicates, nr_model **out, char *error, size_t error_size,
                     Read &&read) {
  if (!out) return report(NR_INVALID_ARGUMENT, "out is NULL", error, error_size);
  *out = nullptr;
  nr_executable *exe = nullptr;
  nr_status status = read(&exe);
  if (status != NR_OK) return status;
  status = nr_model_load(dev, exe, duplicates, out, error, error_size);
  nr_executable_unload(exe);  // (the model keeps what it needs)
  return status;
}

}  // namespace

extern "C" {

nr_status nr_device_open(nr_device **out, char *error, size_t error_size) {
  if (!out) return report(NR_INVALID_ARGUMENT, "out is NULL", error, error_size);
  *out = nullptr;
  return guarded(error, error_size, [&] {
    nr::observe::device_opened();  // (NEURONISH_PROFILE read once per process)
    auto dev = std::make_unique<nr_device>();
    dev->device = std::make_shared<nr::Device>(nr::config_from_env());
    *out = dev.release();
  });
}

void nr_device_close(nr_device *dev) { delete dev; }

size_t nr_device_num_cores(const nr_device *dev) {
  return dev ? dev->device->config().visible_cores.size() : 0;
}

nr_status nr_device_core(const nr_device *dev, size_t index, nr_core_info *info) {
  if (!dev || !info || index >= dev->device->config().visible_cores.size()) return NR_INVALID_ARGUMENT;
  int core = dev->device->config().visible_cores[index];
  info->core = core;
  info->used = dev->device->used(core);
  info->total = dev->device->config().core_memory;
  return NR_OK;
}

nr_status nr_device_charge(nr_device *dev, const int32_t *cores, const int64_t *deltas, size_t n, char *error,
                           size_t error_size) {
  if (!dev || (n && (!cores || !deltas)))
    return report(NR_INVALID_ARGUMENT, dev ? "cores or deltas is NULL" : "dev is NULL", error, error_size);
  return guarded(error, error_size, [&] {
    dev->device->charge(std::vector<int>(cores, cores + n), std::vector<int64_t>(deltas, deltas + n));
  });
}

nr_status nr_device_fail_core(nr_device *dev, int32_t core, const char *why, char *error, size_t error_size) {
  if (!dev) return report(NR_INVALID_ARGUMENT, "dev is NULL", error, error_size);
  return guarded(error, error_size,
                 [&] { dev->device->fail_core(core, why && *why ? std::string(why) : "hardware error"); });
}

nr_status nr_device_core_state(const nr_device *dev, int32_t core, nr_core_state *state, char *why,
                               size_t why_size) {
  if (!dev || !state)
    return report(NR_INVALID_ARGUMENT, dev ? "state is NULL" : "dev is NULL", why, why_size);
  return guarded(why, why_size, [&] {
    const std::string message = dev->device->failure(core);
    *state = message.empty() ? NR_CORE_WORKING : NR_CORE_FAILED;
    report(NR_OK, message, why, why_size);
  });
}

nr_status nr_model_load(nr_device *dev, const nr_executable *exe, uint32_t duplicates, nr_model **out,
                        char *error, size_t error_size) {
  if (!out) return report(NR_INVALID_ARGUMENT, "out is NULL", error, error_size);
  *out = nullptr;
  if (!dev || !exe) return report(NR_INVALID_ARGUMENT, dev ? "exe is NULL" : "dev is NULL", error, error_size);
  if (duplicates < 1) return report(NR_INVALID_ARGUMENT, "duplicates must be >= 1, got 0", error, error_size);
  return guarded(error, error_size, [&] {
    auto m = std::make_unique<nr_model>();
    m->exe.exe = exe->exe;
    m->model = std::make_unique<nr::Model>(dev->device, exe->exe, duplicates);
    *out = m.release();
  });
}


nr_status nr_model_load_bytes(nr_device *dev, const void *data, size_t size, uint32_t duplicates, nr_model **out,
                              char *error, size_t error_size) {
  return load_model(dev, duplicates, out, error, error_size, [&](nr_executable **exe) {
    return nr_executable_load_bytes(data, size, exe, error, error_size);
  });
}

nr_status nr_model_load_file(nr_device *dev, const char *path, uint32_t duplicates, nr_model **out,
                             char *error, size_t error_size) {
  return load_model(dev, duplicates, out, error, error_size, [&](nr_executable **exe) {
    return nr_executable_load_file(path, exe, error, error_size);
  });
}

void nr_model_unload(nr_model *model) { delete model; }

const nr_executable *nr_model_executable(const nr_model *model) { return model ? &model->exe : nullptr; }

int64_t nr_model_batch_size(const nr_model *model) { return model ? model->model->batch_size() : -1; }

size_t nr_model_duplicates(const nr_model *model) { return model ? model->model->duplicates() : 0; }

nr_status nr_model_copy(const nr_model *model, size_t index, nr_copy_info *info) {
  static_assert(sizeof(int) == sizeof(int32_t), "core ids are handed out as int32_t");
  if (!model || !info || index >= model->model->duplicates()) return NR_INVALID_ARGUMENT;
  const nr::Copy &copy = model->model->copy(index);
  info->cores = reinterpret_cast<const int32_t *>(copy.reservation.cores.data());
  info->bytes_per_core = copy.reservation.bytes_per_core.data();
  info->num_cores = copy.reservation.cores.size();
  info->runs = copy.runs.load(std::memory_order_relaxed);
  info->busy_ns = copy.busy_ns.load(std::memory_order_relaxed);
  return NR_OK;
}

nr_status nr_execute(nr_model *model, const nr_tensor *inputs, size_t num_inputs, const nr_tensor *outputs,
                     size_t num_outputs, char *error, size_t error_size) {
  if (!model) return report(NR_INVALID_ARGUMENT, "model is NULL", error, error_size);
  return guarded(error, error_size, [&] { model->model->execute(inputs, num_inputs, outputs, num_outputs, nullptr); });
}

nr_status nr_execute_with(nr_model *model, const nr_tensor *inputs, size_t num_inputs, const nr_tensor *outputs,
                          size_t num_outputs, const nr_execute_options *options, char *error, size_t error_size) {
  if (!model) return report(NR_INVALID_ARGUMENT, "model is NULL", error, error_size);
  nr::Cutoff cutoff;
  if (options) {
    cutoff.deadline = options->deadline_ns > 0 ? double(options->deadline_ns) * 1e-9 : 0.0;
    cutoff.cancel = options->cancel;
  }
  bool any = cutoff.deadline > 0 || cutoff.cancel;
  return guarded(error, error_size,
                 [&] { model->model->execute(inputs, num_inputs, outputs, num_outputs, any ? &cutoff : nullptr); });
}

void nr_host_observes(void) { nr::observe::host_observes(); }

nr_status nr_model_set_label(nr_model *model, const char *label) {
  if (!model || !label) return NR_INVALID_ARGUMENT;
  return guarded(nullptr, 0, [&] { model->model->set_label(label); });
}

uint64_t nr_model_id(const nr_model *model) { return model ? model->model->id() : 0; }

nr_status nr_model_instruction_spec(const nr_model *model, size_t index, const int64_t **ints, size_t *num_ints,
                                    const double **floats, size_t *num_floats) {
  if (!model || !ints || !num_ints || !floats || !num_floats) return NR_INVALID_ARGUMENT;
  auto &specs = model->model->copy(0).program->specs;
  if (index >= specs.size()) return NR_INVALID_ARGUMENT;
  if (!specs[index].taken) return NR_UNSUPPORTED;
  *ints = specs[index].spec.ints.data();
  *num_ints = specs[index].spec.ints.size();
  *floats = specs[index].spec.floats.data();
  *num_floats = specs[index].spec.floats.size();
  return NR_OK;
}

int32_t nr_model_instruction_team(const nr_model *model, size_t index) {
  if (!model) return -1;
  auto &specs = model->model->copy(0).program->specs;
  return index < specs.size() ? int32_t(specs[index].team) : -1;
}

int64_t nr_model_stage_thread(const nr_model *model, size_t copy, size_t stage) {
  if (!model || copy >= model->model->duplicates()) return -1;
  const nr::Copy &c = model->model->copy(copy);
  return stage < c.cores.size() ? c.ran_on[stage].load(std::memory_order_relaxed) : -1;
}

int64_t nr_model_narrow_runs(const nr_model *model, size_t copy) {
  if (!model || copy >= model->model->duplicates()) return -1;
  return int64_t(model->model->copy(copy).narrow_runs.load(std::memory_order_relaxed));
}

}  // extern "C"
