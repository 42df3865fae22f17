# rlserve_add_library(name sources...): a static library whose headers are included from the
# repository root ("model/safetensors.hpp"), position-independent so tests and tools can link it
# into anything. A folder with headers only becomes an INTERFACE library.
function(rlserve_add_library name)
  if(ARGN)
    add_library(${name} STATIC ${ARGN})
    target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
    set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    set(${name}_scope PUBLIC PARENT_SCOPE)
  else()
    add_library(${name} INTERFACE)
    target_include_directories(${name} INTERFACE ${PROJECT_SOURCE_DIR})
    set(${name}_scope INTERFACE PARENT_SCOPE)
  endif()
endfunction()
